// client_test.mjs — end-to-end tests of `kiln serve` with the official
// `openai` and `@anthropic-ai/sdk` clients (started by run_client_tests.sh).
//
// Expected values come from transformers (tests/fixtures/*/reference.json,
// written on the GPU machine) or from the server's own solo runs (batch
// invariance), never from hand-written token lists.
//   A = llama fixture, ids only, API key "test-key"
//   B = llama fixture, long context, max batch 1, queue 1
//   C = server_chat fixture (tokenizer + chat template), when present
//   W = the tiny Whisper fixture (audio endpoints: audio_test.mjs)
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';

const mods = path.resolve(process.argv[2]);
const { pathToFileURL } = await import('node:url');
const { default: OpenAI } = await import(pathToFileURL(path.join(mods, 'openai/index.mjs')).href);
const { default: Anthropic } = await import(pathToFileURL(path.join(mods, '@anthropic-ai/sdk/index.mjs')).href);
const A = process.env.KILN_URL_A, B = process.env.KILN_URL_B, C = process.env.KILN_URL_C;
const FIX = process.env.KILN_FIXTURES;

let passed = 0, failed = 0;
async function test(name, fn) {
  try {
    await fn();
    passed++;
    console.log(`ok   ${name}`);
  } catch (e) {
    failed++;
    console.log(`FAIL ${name}: ${e && e.stack ? e.stack : e}`);
  }
}

const oa = (url, key = 'test-key') => new OpenAI({ baseURL: url + '/v1', apiKey: key, maxRetries: 0, timeout: 60000 });
const raw = (url, p, init = {}) => fetch(url + p, init);
const metrics = async (url, key) => {
  const r = await raw(url, '/metrics', { headers: key ? { authorization: 'Bearer ' + key } : {} });
  const t = await r.text();
  const get = (name) => {
    const m = t.match(new RegExp('^' + name.replace(/[{}"=]/g, (c) => '\\' + c) + ' (\\S+)$', 'm'));
    return m ? Number(m[1]) : NaN;
  };
  return { text: t, get };
};
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
async function until(fn, ms = 10000) {
  const t0 = Date.now();
  for (;;) {
    if (await fn()) return true;
    if (Date.now() - t0 > ms) return false;
    await sleep(50);
  }
}
async function expectStatus(promise, status, cls) {
  try {
    await promise;
  } catch (e) {
    assert.equal(e.status, status, `status ${e.status} (${e.message})`);
    if (cls) assert.ok(e instanceof cls, `${e.constructor.name} is not ${cls.name}`);
    return e;
  }
  assert.fail(`expected HTTP ${status}`);
}

// ---------------------------------------------------------------- A: token ids
const llama = JSON.parse(fs.readFileSync(path.join(FIX, 'llama/reference.json'), 'utf8'));
const ca = oa(A);
const ids = async (client, prompt, extra = {}) => {
  const r = await client.completions.create({ model: 'llama', prompt, temperature: 0, ignore_eos: true, ...extra });
  return r;
};
const streamIds = async (client, prompt, extra = {}) => {
  const s = await client.completions.create({ model: 'llama', prompt, temperature: 0, ignore_eos: true, stream: true, ...extra });
  const out = [];
  let finish = null;
  for await (const ch of s) {
    for (const c of ch.choices) {
      if (c.token_ids) out.push(...c.token_ids);
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  return { ids: out, finish };
};

await test('health and models', async () => {
  const h = await (await raw(A, '/health')).json();
  assert.deepEqual(h, { status: 'ok' });
  const models = [];
  for await (const m of ca.models.list()) models.push(m);
  assert.equal(models.length, 1);
  assert.equal(models[0].id, 'llama');
  const one = await ca.models.retrieve('llama');
  assert.equal(one.id, 'llama');
  await expectStatus(ca.models.retrieve('nope'), 404, OpenAI.NotFoundError);
});

await test('greedy completion equals transformers (ids)', async () => {
  const r = await ids(ca, llama.prompt, { max_tokens: llama.greedy.length });
  assert.deepEqual(r.choices[0].token_ids, llama.greedy);
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.usage.prompt_tokens, llama.prompt.length);
  assert.equal(r.usage.completion_tokens, llama.greedy.length);
  assert.equal(r.usage.prompt_tokens_details.cached_tokens, 0);
  const s = await streamIds(ca, llama.prompt, { max_tokens: llama.greedy.length });
  assert.deepEqual(s.ids, llama.greedy);
  assert.equal(s.finish, 'length');
});

await test('32 concurrent streams each equal their solo run', async () => {
  const jobs = [];
  for (let i = 0; i < 32; i++) jobs.push({ prompt: llama.ids.slice(0, 1 + (i * 7) % 40), max_tokens: 4 + (i * 5) % 40 });
  const solo = [];
  for (const j of jobs) solo.push((await ids(ca, j.prompt, { max_tokens: j.max_tokens })).choices[0].token_ids);
  const got = await Promise.all(jobs.map((j) => streamIds(ca, j.prompt, { max_tokens: j.max_tokens })));
  for (let i = 0; i < jobs.length; i++) {
    assert.equal(got[i].ids.length, jobs[i].max_tokens, `stream ${i} lost or duplicated tokens`);
    assert.deepEqual(got[i].ids, solo[i], `stream ${i} differs from its solo run`);
  }
  const m = await metrics(A, 'test-key');
  assert.ok(m.get('kiln_batch_size_sum') > m.get('kiln_batch_size_count'), 'no step ran more than one sequence');
});

await test('seeds reproduce, different seeds differ', async () => {
  const p = { max_tokens: 24, temperature: 1.0, top_p: 1 };
  const a = await ca.completions.create({ model: 'llama', prompt: llama.prompt, seed: 7, ...p });
  const b = await ca.completions.create({ model: 'llama', prompt: llama.prompt, seed: 7, ...p });
  const c = await ca.completions.create({ model: 'llama', prompt: llama.prompt, seed: 8, ...p });
  assert.deepEqual(a.choices[0].token_ids, b.choices[0].token_ids);
  assert.notDeepEqual(a.choices[0].token_ids, c.choices[0].token_ids);
});

await test('stop_token_ids, logprobs', async () => {
  const k = llama.greedy.findIndex((t, i) => llama.greedy.indexOf(t) === i && i >= 3);
  const r = await ids(ca, llama.prompt, { max_tokens: 24, stop_token_ids: [llama.greedy[k]], logprobs: 3 });
  assert.deepEqual(r.choices[0].token_ids, llama.greedy.slice(0, k + 1));
  assert.equal(r.choices[0].finish_reason, 'stop');
  const lp = r.choices[0].logprobs;
  assert.equal(lp.token_logprobs.length, k + 1);
  for (let i = 0; i < lp.top_logprobs.length; i++) {
    const tops = Object.values(lp.top_logprobs[i]);
    assert.ok(tops.length >= 1 && tops.length <= 3);
    assert.ok(Math.abs(Math.max(...tops) - lp.token_logprobs[i]) < 1e-6, 'greedy token is not the most likely');
  }
});

await test('400s name the field; the server keeps serving', async () => {
  let e = await expectStatus(ca.completions.create({ model: 'llama', prompt: [1, 2], temperature: 'hot' }), 400, OpenAI.BadRequestError);
  assert.equal(e.error?.param ?? e.param, 'temperature');
  await expectStatus(ca.completions.create({ model: 'llama', prompt: [1, 2], max_tokens: -1 }), 400, OpenAI.BadRequestError);
  await expectStatus(ca.completions.create({ model: 'llama', prompt: [1, 2], bogus_field: 1 }), 400);
  await expectStatus(ca.completions.create({ model: 'llama', prompt: [1, 99999] }), 400);
  await expectStatus(ca.completions.create({ model: 'llama', prompt: [1, 2], n: 3 }), 400);
  e = await expectStatus(ca.completions.create({ model: 'llama', prompt: Array(120).fill(5), max_tokens: 20 }), 400);
  assert.match(e.message, /context/);
  const hdr = { authorization: 'Bearer test-key', 'content-type': 'application/json' };
  const bodies = [
    '{"prompt": [1, 2',                                   // malformed
    '[1, 2, 3]',                                          // not an object
    '{"prompt": [1, 2], "max_tokens": 1e400}',            // overflowing number
    '{"prompt": [1, 2], "max_tokens": 99999999999999999999}',
    Buffer.from([0x7b, 0x22, 0x70, 0xff, 0xfe, 0x22, 0x3a, 0x31, 0x7d]), // invalid UTF-8
    '{"prompt": [1, 2], "prompt": [3]}',                  // duplicate key
    '{"prompt": [1, 2], "stop": 5}',
    '{"prompt": [1, 2], "logit_bias": {"abc": 1}}',
    '{"prompt": {"x": 1}}',
  ];
  for (const body of bodies) {
    const r = await raw(A, '/v1/completions', { method: 'POST', headers: hdr, body });
    assert.equal(r.status, 400, `body ${body}`);
    const j = await r.json();
    assert.ok(typeof j.error.message === 'string' && j.error.message.length > 0);
  }
  const big = await raw(A, '/v1/completions', { method: 'POST', headers: hdr, body: '{"prompt": "' + 'a'.repeat(5 << 20) + '"}' });
  assert.equal(big.status, 413);
  const wrongMethod = await raw(A, '/v1/completions', { headers: hdr });
  assert.equal(wrongMethod.status, 405);
  const r = await ids(ca, llama.prompt, { max_tokens: 3 });
  assert.deepEqual(r.choices[0].token_ids, llama.greedy.slice(0, 3));
});

await test('401 without or with a wrong API key; x-api-key works', async () => {
  await expectStatus(oa(A, 'wrong').completions.create({ model: 'llama', prompt: [1, 2] }), 401, OpenAI.AuthenticationError);
  const r = await raw(A, '/v1/models');
  assert.equal(r.status, 401);
  const ok = await raw(A, '/v1/models', { headers: { 'x-api-key': 'test-key' } });
  assert.equal(ok.status, 200);
  assert.equal((await raw(A, '/health')).status, 200);
});

// ------------------------------------------- B: long generations, batch 1, queue 1
const cb = oa(B, 'none');
await test('client disconnect mid-stream cancels and frees the KV blocks', async () => {
  const before = await metrics(B);
  const ac = new AbortController();
  const s = await cb.completions.create(
    { model: 'llama', prompt: [5, 6, 7], max_tokens: 4000, temperature: 0, ignore_eos: true, stream: true },
    { signal: ac.signal });
  let n = 0;
  try {
    for await (const ch of s) {
      n += ch.choices[0]?.token_ids?.length ?? 0;
      if (n >= 2) ac.abort();
    }
  } catch (e) {
    assert.ok(e.name === 'APIUserAbortError' || e.name === 'AbortError', e.name);
  }
  const c0 = before.get('kiln_requests_finished_total{reason="cancelled"}');
  const ok = await until(async () => {
    const m = await metrics(B);
    return m.get('kiln_requests_finished_total{reason="cancelled"}') === c0 + 1 &&
      m.get('kiln_kv_blocks_free') + m.get('kiln_kv_blocks_cached') === m.get('kiln_kv_blocks_total') &&
      m.get('kiln_running_sequences') === 0;
  });
  assert.ok(ok, 'the aborted request was not cancelled / its blocks not freed');
});

await test('client disconnect while waiting for a non-streaming answer cancels it', async () => {
  const before = await metrics(B);
  const c0 = before.get('kiln_requests_finished_total{reason="cancelled"}');
  const ac = new AbortController();
  const p = cb.completions.create(
    { model: 'llama', prompt: [8, 9, 10], max_tokens: 4000, temperature: 0, ignore_eos: true }, { signal: ac.signal });
  await until(async () => (await metrics(B)).get('kiln_running_sequences') === 1);
  ac.abort();
  await assert.rejects(p);
  const ok = await until(async () => {
    const m = await metrics(B);
    return m.get('kiln_requests_finished_total{reason="cancelled"}') === c0 + 1 && m.get('kiln_running_sequences') === 0;
  });
  assert.ok(ok, 'the abandoned non-streaming request kept running');
  const m = await metrics(B);
  assert.ok(m.get('kiln_requests_finished_total{reason="length"}') === before.get('kiln_requests_finished_total{reason="length"}'),
    'it ran to max_tokens instead of being cancelled');
});

await test('a full queue answers 429', async () => {
  // one runs, one waits, the rest are refused: 1000 tokens keep the only slot busy far longer
  // than the six submissions take (sanitizer builds are slow: generous client timeout)
  const slow = oa(B, 'none').withOptions({ timeout: 600000 });
  const long = () => slow.completions.create({ model: 'llama', prompt: [5, 6, 7], max_tokens: 1000, temperature: 0, ignore_eos: true });
  const results = await Promise.allSettled([long(), long(), long(), long(), long(), long()]);
  const limited = results.filter((r) => r.status === 'rejected' && r.reason.status === 429);
  const done = results.filter((r) => r.status === 'fulfilled');
  const other = results.filter((r) => r.status === 'rejected' && r.reason.status !== 429);
  assert.equal(other.length, 0, `unexpected failures: ${other.map((r) => r.reason.message).join('; ')}`);
  assert.ok(limited.length >= 3, `only ${limited.length} of 6 were refused with 429`);
  assert.ok(limited.every((r) => r.reason instanceof OpenAI.RateLimitError));
  assert.ok(done.length >= 1 && done.every((r) => r.value.usage.completion_tokens === 1000), 'an accepted request did not finish');
});

// ------------------------------------------------ C: text, chat, tools, Anthropic
if (C) {
  const ref = JSON.parse(fs.readFileSync(path.join(FIX, 'server_chat/reference.json'), 'utf8'));
  const cc = oa(C, 'none');
  const ant = new Anthropic({ baseURL: C, apiKey: 'none', maxRetries: 0 });
  const byName = Object.fromEntries(ref.cases.map((c) => [c.name, c]));
  // what the text of the oracle's greedy run means as a chat answer
  const expectChat = (text, startReasoning) => {
    let t = text, reasoning = '';
    if (startReasoning) t = '<think>' + t;
    const m = t.match(/^\s*<think>([\s\S]*?)(<\/think>|$)/);
    if (m) { reasoning = m[1].trim(); t = t.slice(m[0].length); }
    const calls = [];
    t = t.replace(/<tool_call>([\s\S]*?)<\/tool_call>/g, (_, body) => { calls.push(JSON.parse(body.trim())); return ''; });
    return { content: t.trim(), reasoning, calls };
  };
  const chatReq = (c, extra = {}) => ({
    model: 'm', messages: c.messages, temperature: 0, max_tokens: ref.max_new_tokens,
    ...(c.tools ? { tools: c.tools } : {}),
    ...(Object.keys(c.kwargs).length ? { chat_template_kwargs: c.kwargs } : {}), ...extra,
  });

  for (const c of ref.cases.filter((c) => c.kind === 'chat')) {
    await test(`chat "${c.name}" equals transformers (non-stream and stream)`, async () => {
      const want = expectChat(c.greedy_text_skip_special, c.prompt_text.trimEnd().endsWith('<think>'));
      const r = await cc.chat.completions.create(chatReq(c));
      const msg = r.choices[0].message;
      assert.equal(r.usage.prompt_tokens, c.prompt_ids.length, 'prompt tokens differ from the HF template + tokenizer');
      assert.equal(r.usage.completion_tokens, c.greedy_ids.length, 'generated a different number of tokens than HF');
      assert.equal(msg.content ?? '', want.content);
      assert.equal(msg.reasoning_content ?? '', want.reasoning);
      assert.equal((msg.tool_calls ?? []).length, want.calls.length);
      (msg.tool_calls ?? []).forEach((tc, i) => {
        assert.equal(tc.function.name, want.calls[i].name);
        assert.deepEqual(JSON.parse(tc.function.arguments), want.calls[i].arguments);
      });
      assert.equal(r.choices[0].finish_reason, want.calls.length ? 'tool_calls' : c.greedy_ends_with_eos ? 'stop' : 'length');
      const s = await cc.chat.completions.create(chatReq(c, { stream: true, stream_options: { include_usage: true } }));
      let content = '', reasoning = '', calls = [], finish = null, usage = null, role = null;
      for await (const ch of s) {
        if (ch.usage) usage = ch.usage;
        for (const ch0 of ch.choices) {
          const d = ch0.delta;
          if (d.role) role = d.role;
          content += d.content ?? '';
          reasoning += d.reasoning_content ?? '';
          for (const tc of d.tool_calls ?? []) calls.push(tc);
          if (ch0.finish_reason) finish = ch0.finish_reason;
        }
      }
      assert.equal(role, 'assistant');
      assert.equal(content, want.content);
      assert.equal(reasoning, want.reasoning);
      assert.equal(calls.length, want.calls.length);
      assert.equal(finish, r.choices[0].finish_reason);
      assert.equal(usage.completion_tokens, c.greedy_ids.length);
    });
  }

  for (const c of ref.cases.filter((c) => c.kind === 'completion')) {
    await test(`completion "${c.name}" equals transformers`, async () => {
      const r = await cc.completions.create({ model: 'm', prompt: c.prompt, temperature: 0, max_tokens: ref.max_new_tokens });
      assert.equal(r.usage.prompt_tokens, c.prompt_ids.length);
      assert.equal(r.choices[0].text, c.greedy_text_skip_special);
      const s = await cc.completions.create({ model: 'm', prompt: c.prompt, temperature: 0, max_tokens: ref.max_new_tokens, stream: true });
      let text = '';
      for await (const ch of s) text += ch.choices[0]?.text ?? '';
      assert.equal(text, c.greedy_text_skip_special);
    });
  }

  await test('stop strings cut the text (stream and not), never emitting a partial stop', async () => {
    const c = byName.fox;
    const full = c.greedy_text_skip_special;
    const stop = full.includes('Stop') ? 'Stop' : full.slice(Math.floor(full.length / 2), Math.floor(full.length / 2) + 3);
    const want = full.slice(0, full.indexOf(stop));
    const r = await cc.completions.create({ model: 'm', prompt: c.prompt, temperature: 0, max_tokens: 48, stop: [stop, 'zzzz'] });
    assert.equal(r.choices[0].text, want);
    assert.equal(r.choices[0].finish_reason, 'stop');
    const s = await cc.completions.create({ model: 'm', prompt: c.prompt, temperature: 0, max_tokens: 48, stop, stream: true });
    let text = '';
    for await (const ch of s) text += ch.choices[0]?.text ?? '';
    assert.equal(text, want);
  });

  await test('tools round trip (tool_calls -> role tool -> answer)', async () => {
    const c = byName.tool_call, res = byName.tool_result;
    const r = await cc.chat.completions.create(chatReq(c));
    const msg = r.choices[0].message;
    if (!expectChat(c.greedy_text_skip_special).calls.length) return; // the oracle itself made no call
    assert.equal(r.choices[0].finish_reason, 'tool_calls');
    const toolMsg = res.messages[2];
    const msgs = [c.messages[0], { role: 'assistant', content: null, tool_calls: msg.tool_calls },
      { role: 'tool', tool_call_id: msg.tool_calls[0].id, content: toolMsg.content }];
    const r2 = await cc.chat.completions.create({ model: 'm', messages: msgs, tools: c.tools, temperature: 0, max_tokens: 48 });
    assert.equal(r2.usage.prompt_tokens, res.prompt_ids.length, 'round-trip prompt differs from the HF rendering');
    assert.equal(r2.choices[0].message.content, expectChat(res.greedy_text_skip_special).content);
    // tool_choice "required" starts the answer inside <tool_call>: same call as the free answer
    const rq = await cc.chat.completions.create(chatReq(c, { tool_choice: 'required' }));
    assert.equal(rq.choices[0].finish_reason, 'tool_calls');
    assert.deepEqual(rq.choices[0].message.tool_calls.map((t) => t.function), msg.tool_calls.map((t) => t.function));
    assert.equal(rq.usage.prompt_tokens, c.prompt_ids.length + 2, 'the forced "<tool_call>\\n" should add 2 tokens');
    // "none" leaves the tags as text
    const rn = await cc.chat.completions.create(chatReq(c, { tool_choice: 'none' }));
    assert.equal(rn.choices[0].message.tool_calls, undefined);
    assert.match(rn.choices[0].message.content, /<tool_call>/);
  });

  await test('prefix cache: a repeated prompt reports cached_tokens and the same answer', async () => {
    const c = byName.tool_calls_two; // 198 prompt tokens
    const a = await cc.chat.completions.create(chatReq(c));
    const b = await cc.chat.completions.create(chatReq(c));
    const blocks = Math.floor((c.prompt_ids.length - 1) / 16) * 16;
    assert.equal(b.usage.prompt_tokens_details.cached_tokens, blocks);
    assert.deepEqual(b.choices[0].message.tool_calls.map((t) => t.function),
      a.choices[0].message.tool_calls.map((t) => t.function));
    assert.equal(b.usage.completion_tokens, c.greedy_ids.length);
    const m = await metrics(C);
    assert.ok(m.get('kiln_prefix_cache_hit_tokens_total') >= blocks);
  });

  await test('anthropic messages: text, thinking, tool_use, stream events', async () => {
    const cap = byName.capital;
    const m = await ant.messages.create({ model: 'm', max_tokens: 48, temperature: 0, messages: cap.messages });
    assert.equal(m.type, 'message');
    assert.equal(m.content[0].type, 'text');
    assert.equal(m.content[0].text, expectChat(cap.greedy_text_skip_special).content);
    assert.equal(m.usage.input_tokens, cap.prompt_ids.length);
    assert.equal(m.usage.output_tokens, cap.greedy_ids.length);
    assert.equal(m.stop_reason, cap.greedy_ends_with_eos ? 'end_turn' : 'max_tokens');
    // streaming: exact event sequence
    const events = [];
    const st = ant.messages.stream({ model: 'm', max_tokens: 48, temperature: 0, messages: cap.messages });
    for await (const ev of st) events.push(ev.type);
    const final = await st.finalMessage();
    assert.equal(final.content[0].text, m.content[0].text);
    assert.equal(events[0], 'message_start');
    assert.equal(events[1], 'content_block_start');
    assert.ok(events.slice(2, -3).every((t) => t === 'content_block_delta'));
    assert.deepEqual(events.slice(-3), ['content_block_stop', 'message_delta', 'message_stop']);
    // thinking
    const th = byName.think;
    const want = expectChat(th.greedy_text_skip_special);
    const mt = await ant.messages.create({ model: 'm', max_tokens: 48, temperature: 0, messages: th.messages });
    if (want.reasoning) {
      assert.equal(mt.content[0].type, 'thinking');
      assert.equal(mt.content[0].thinking, want.reasoning);
    }
    assert.equal(mt.content.find((b) => b.type === 'text')?.text ?? '', want.content);
    // tool_use + tool_result round trip
    const tc = byName.tool_call;
    const tools = tc.tools.map((t) => ({ name: t.function.name, description: t.function.description, input_schema: t.function.parameters }));
    const mu = await ant.messages.create({ model: 'm', max_tokens: 48, temperature: 0, messages: tc.messages, tools });
    const wantCalls = expectChat(tc.greedy_text_skip_special).calls;
    const uses = mu.content.filter((b) => b.type === 'tool_use');
    assert.equal(uses.length, wantCalls.length);
    if (uses.length) {
      assert.equal(mu.stop_reason, 'tool_use');
      assert.equal(uses[0].name, wantCalls[0].name);
      assert.deepEqual(uses[0].input, wantCalls[0].arguments);
      const res = byName.tool_result;
      const mr = await ant.messages.create({
        model: 'm', max_tokens: 48, temperature: 0, tools,
        messages: [tc.messages[0], { role: 'assistant', content: mu.content },
          { role: 'user', content: [{ type: 'tool_result', tool_use_id: uses[0].id, content: res.messages[2].content }] }],
      });
      assert.equal(mr.usage.input_tokens, res.prompt_ids.length, 'anthropic round-trip prompt differs from the HF rendering');
      assert.equal(mr.content[0].text, expectChat(res.greedy_text_skip_special).content);
      // the streamed tool_use block carries the same input
      const su = ant.messages.stream({ model: 'm', max_tokens: 48, temperature: 0, messages: tc.messages, tools });
      const fm = await su.finalMessage();
      assert.deepEqual(fm.content.filter((b) => b.type === 'tool_use').map((b) => b.input), uses.map((b) => b.input));
      const ma = await ant.messages.create({ model: 'm', max_tokens: 48, temperature: 0, messages: tc.messages, tools,
        tool_choice: { type: 'any' } });
      assert.deepEqual(ma.content.filter((b) => b.type === 'tool_use').map((b) => [b.name, b.input]),
        uses.map((b) => [b.name, b.input]));
    }
    await expectStatus(ant.messages.create({ model: 'm', max_tokens: 'x', messages: cap.messages }), 400, Anthropic.BadRequestError);
  });
}

const { audioTests } = await import('./audio_test.mjs');
await audioTests({ test, oa, raw, expectStatus, OpenAI, A, W: process.env.KILN_URL_W, FIX, BIN: process.env.KILN_BIN });

console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
