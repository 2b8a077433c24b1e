// audio_test.mjs — /v1/audio/transcriptions and /v1/audio/translations of
// `kiln serve tests/fixtures/whisper` (server W of run_client_tests.sh)
// driven by the official `openai` client; called from client_test.mjs.
//
// Expected values: transformers' greedy decode of the tiny random Whisper on
// jfk.wav (tests/fixtures/whisper/reference.json, tools/fixtures/gen_whisper.py)
// and `kiln transcribe` on the same file with the same options (the CLI is
// itself checked against transformers by test_whisper / test_cli_whisper).
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

export async function audioTests({ test, oa, raw, expectStatus, OpenAI, A, W, FIX, BIN }) {
  if (!W) return;
  const KEY = 'audio-key';
  const cw = oa(W, KEY);
  const jfk = path.join(FIX, 'audio', 'jfk.wav');
  const ref = JSON.parse(fs.readFileSync(path.join(FIX, 'whisper', 'reference.json'), 'utf8'));
  const caseOf = (name) => ref.cases.find((c) => c.name === name);
  const eot = ref.special_ids['<|endoftext|>'];
  // the oracle cases decode at most max_new_tokens without the fallback ladder
  const greedy = { model: 'whisper', temperature_increment_on_fallback: 0, max_new_tokens: 24 };
  // the CLI runs on the servers' backend (run_client_tests.sh KILN_SERVE_ARGS, e.g. --backend cuda)
  const backendArgs = (process.env.KILN_SERVE_ARGS || '').split(/\s+/).filter(Boolean);
  const cli = (...args) => {
    const r = spawnSync(BIN, ['transcribe', jfk, '--model', path.join(FIX, 'whisper'), '--no-fallback',
      '--max-new-tokens', '24', ...backendArgs, ...args], { encoding: 'utf8' });
    assert.equal(r.status, 0, `kiln transcribe ${args.join(' ')}: ${r.stderr}`);
    return r.stdout;
  };

  await test('audio: json text = transformers greedy (no timestamps) = kiln transcribe', async () => {
    const want = caseOf('greedy_en_notimestamps');
    const r = await cw.audio.transcriptions.create({ ...greedy, file: fs.createReadStream(jfk), language: 'en',
      without_timestamps: true });
    assert.equal(r.text, want.text);
    assert.equal(r.text, JSON.parse(cli('--language', 'en', '--no-timestamps', '--format', 'json')).text);
  });

  let verbose;
  await test('audio: verbose_json segment tokens = transformers greedy with timestamps; = kiln transcribe', async () => {
    const want = caseOf('greedy_en_timestamps').tokens.filter((t) => t !== eot);
    verbose = await cw.audio.transcriptions.create({ ...greedy, file: fs.createReadStream(jfk), language: 'en',
      response_format: 'verbose_json', timestamp_granularities: ['segment'] });
    assert.equal(verbose.language, 'en');
    assert.equal(verbose.duration, 11);
    assert.ok(verbose.segments.length >= 1);
    // each segment holds its <|start|> text <|end|> tokens: together they are the decoded sequence
    assert.deepEqual(verbose.segments.flatMap((s) => s.tokens), want);
    assert.deepEqual(verbose, JSON.parse(cli('--language', 'en', '--format', 'verbose_json')));
  });

  await test('audio: timestamp_granularities word = kiln transcribe --word-timestamps', async () => {
    const r = await cw.audio.transcriptions.create({ ...greedy, file: fs.createReadStream(jfk), language: 'en',
      response_format: 'verbose_json', timestamp_granularities: ['word', 'segment'] });
    assert.ok(Array.isArray(r.words) && r.words.length > 0, JSON.stringify(r).slice(0, 300));
    for (const w of r.words) assert.ok(typeof w.word === 'string' && w.start <= w.end && w.end <= r.duration);
    assert.equal(r.words.map((w) => w.word).join(''), r.text);
    assert.deepEqual(r, JSON.parse(cli('--language', 'en', '--format', 'verbose_json', '--word-timestamps')));
  });

  await test('audio: text / srt / vtt bodies = kiln transcribe --format', async () => {
    for (const fmt of ['text', 'srt', 'vtt']) {
      const r = await cw.audio.transcriptions.create({ ...greedy, file: fs.createReadStream(jfk), language: 'en',
        response_format: fmt });
      assert.equal(typeof r, 'string', fmt);
      assert.equal(r, cli('--language', 'en', '--format', fmt), fmt);
    }
  });

  await test('audio: stream = transcript.text.delta events then transcript.text.done (= the non-streamed text)', async () => {
    const s = await cw.audio.transcriptions.create({ ...greedy, file: fs.createReadStream(jfk), language: 'en',
      stream: true });
    const types = [];
    let deltas = '', done = null;
    for await (const ev of s) {
      types.push(ev.type);
      if (ev.type === 'transcript.text.delta') deltas += ev.delta;
      if (ev.type === 'transcript.text.done') done = ev.text;
    }
    assert.ok(types.length >= 2 && types.slice(0, -1).every((t) => t === 'transcript.text.delta'), types.join(','));
    assert.equal(types.at(-1), 'transcript.text.done');
    assert.equal(done, deltas);
    assert.equal(done, verbose ? verbose.text : done);
  });

  await test('audio: translations (language detected) and prompt = kiln transcribe', async () => {
    const r = await cw.audio.translations.create({ ...greedy, file: fs.createReadStream(jfk), response_format: 'verbose_json' });
    assert.deepEqual(r, JSON.parse(cli('--task', 'translate', '--format', 'verbose_json')));
    assert.equal(r.task, 'translate');
    const p = await cw.audio.transcriptions.create({ ...greedy, file: fs.createReadStream(jfk), language: 'de',
      prompt: 'Hello there, general', response_format: 'verbose_json' });
    assert.deepEqual(p, JSON.parse(cli('--language', 'de', '--prompt', 'Hello there, general', '--format', 'verbose_json')));
  });

  await test('audio: errors (missing file, bad audio, bad fields, wrong model type, key, body limit)', async () => {
    const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'kiln-audio-'));
    const bad = path.join(tmp, 'notes.wav');
    fs.writeFileSync(bad, 'this is not audio at all, just text pretending to be a wav file\n'.repeat(20));
    let e = await expectStatus(cw.audio.transcriptions.create({ model: 'whisper', file: fs.createReadStream(bad) }), 400,
      OpenAI.BadRequestError);
    assert.match(e.message, /could not be decoded as audio/);
    assert.equal(e.param, 'file');
    const header = path.join(tmp, 'header.wav'); // a WAV header and no samples
    fs.writeFileSync(header, fs.readFileSync(jfk).subarray(0, 44));
    e = await expectStatus(cw.audio.transcriptions.create({ model: 'whisper', file: fs.createReadStream(header) }), 400);
    assert.match(e.message, /could not be decoded as audio/);
    e = await expectStatus(cw.audio.transcriptions.create({ model: 'whisper' }), 400);
    assert.equal(e.param, 'file');
    e = await expectStatus(cw.audio.transcriptions.create({ file: fs.createReadStream(jfk) }), 400);
    assert.equal(e.param, 'model');
    for (const [field, value] of [['response_format', 'mp3'], ['temperature', '1.5'], ['language', 'xx'],
      ['max_new_tokens', '0'], ['stream', 'maybe'], ['colour', 'blue']]) {
      e = await expectStatus(cw.audio.transcriptions.create({ model: 'whisper', file: fs.createReadStream(jfk), [field]: value }),
        400);
      assert.equal(e.param, field, `${field}: ${e.message}`);
    }
    e = await expectStatus(cw.audio.transcriptions.create({ model: 'whisper', file: fs.createReadStream(jfk),
      timestamp_granularities: ['word'] }), 400); // needs verbose_json
    assert.equal(e.param, 'timestamp_granularities');
    e = await expectStatus(cw.audio.translations.create({ model: 'whisper', file: fs.createReadStream(jfk), language: 'en' }), 400);
    assert.equal(e.param, 'language');
    // a Whisper model cannot chat; an LLM server has no audio endpoint
    e = await expectStatus(cw.chat.completions.create({ model: 'whisper', messages: [{ role: 'user', content: 'hi' }] }), 400);
    assert.match(e.message, /\/v1\/audio\/transcriptions/);
    e = await expectStatus(oa(A).audio.transcriptions.create({ model: 'llama', file: fs.createReadStream(jfk) }), 400);
    assert.match(e.message, /not a speech-to-text \(Whisper\) model/);
    await expectStatus(oa(W, 'wrong-key').audio.transcriptions.create({ model: 'whisper', file: fs.createReadStream(jfk) }),
      401, OpenAI.AuthenticationError);
    const big = path.join(tmp, 'big.wav'); // 700 kB > the server's --max-body 600000
    fs.writeFileSync(big, Buffer.concat([fs.readFileSync(jfk), fs.readFileSync(jfk)]));
    await expectStatus(cw.audio.transcriptions.create({ model: 'whisper', file: fs.createReadStream(big) }), 413);
    // raw bodies: not multipart, truncated multipart
    const auth = { authorization: 'Bearer ' + KEY };
    let r = await raw(W, '/v1/audio/transcriptions', { method: 'POST', headers: { ...auth, 'content-type': 'application/json' },
      body: '{"model": "whisper"}' });
    assert.equal(r.status, 400);
    assert.match((await r.json()).error.message, /multipart\/form-data/);
    const b = 'XyZ';
    r = await raw(W, '/v1/audio/transcriptions', { method: 'POST',
      headers: { ...auth, 'content-type': `multipart/form-data; boundary=${b}` },
      body: `--${b}\r\nContent-Disposition: form-data; name="model"\r\n\r\nwhisper\r\n--${b}\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\nRIFF` });
    assert.equal(r.status, 400);
    assert.match((await r.json()).error.message, /no closing boundary/);
    fs.rmSync(tmp, { recursive: true, force: true });
    // the server still works
    const ok = await cw.audio.transcriptions.create({ ...greedy, file: fs.createReadStream(jfk), language: 'en',
      without_timestamps: true });
    assert.equal(ok.text, caseOf('greedy_en_notimestamps').text);
  });

  await test('audio: /metrics counts transcriptions and audio seconds', async () => {
    const r = await raw(W, '/metrics', { headers: { authorization: 'Bearer ' + KEY } });
    const t = await r.text();
    const get = (name) => Number((t.match(new RegExp('^' + name + ' (\\S+)$', 'm')) || [])[1]);
    const n = get('kiln_transcriptions_total');
    assert.ok(n >= 10, t.slice(0, 400));
    assert.ok(Math.abs(get('kiln_audio_seconds_total') - 11 * n) < 1e-6); // every transcription was jfk.wav
    assert.ok(get('kiln_transcribe_seconds_total') > 0);
    assert.equal(get('kiln_transcriptions_waiting'), 0);
    assert.ok(get('kiln_http_requests_total{endpoint="audio"}'.replace(/[{}"=]/g, (c) => '\\' + c)) >= n);
  });
}
