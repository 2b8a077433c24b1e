// bench_serve.mjs — drive N concurrent streaming completions against a
// running `kiln serve` and report aggregate decode tok/s, TTFT and TPOT
// percentiles. Prompts are random token ids (works with `kiln serve
// --synthetic CONFIG.json`, which has no tokenizer).
//
// usage: node tools/bench/bench_serve.mjs --url http://127.0.0.1:8080 [--streams 8]
//          [--requests 1] [--prompt 32] [--gen 64] [--vocab 32000] [--key KEY] [--json]
const args = Object.fromEntries(process.argv.slice(2).reduce((acc, a, i, all) => {
  if (a.startsWith('--')) acc.push([a.slice(2), all[i + 1] && !all[i + 1].startsWith('--') ? all[i + 1] : true]);
  return acc;
}, []));
const url = args.url ?? 'http://127.0.0.1:8080';
const streams = Number(args.streams ?? 8), perStream = Number(args.requests ?? 1);
const promptLen = Number(args.prompt ?? 32), gen = Number(args.gen ?? 64), vocab = Number(args.vocab ?? 32000);
const headers = { 'content-type': 'application/json', ...(args.key ? { authorization: 'Bearer ' + args.key } : {}) };
let seed = 12345;
const rnd = () => ((seed = (seed * 1103515245 + 12345) & 0x7fffffff) % (vocab - 10)) + 5;

async function one() {
  const prompt = Array.from({ length: promptLen }, rnd);
  const t0 = performance.now();
  const r = await fetch(url + '/v1/completions', {
    method: 'POST', headers,
    body: JSON.stringify({ model: 'bench', prompt, max_tokens: gen, temperature: 0, ignore_eos: true, stream: true }),
  });
  if (!r.ok) throw new Error(`HTTP ${r.status}: ${await r.text()}`);
  const dec = new TextDecoder();
  let buf = '', n = 0, tFirst = 0, tLast = 0;
  for await (const chunk of r.body) {
    buf += dec.decode(chunk, { stream: true });
    let i;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(0, i);
      buf = buf.slice(i + 2);
      if (!ev.startsWith('data: ') || ev === 'data: [DONE]') continue;
      const j = JSON.parse(ev.slice(6));
      const c = j.choices?.[0];
      const k = c?.token_ids?.length ?? (c?.text ? 1 : 0);
      if (k) {
        const now = performance.now();
        if (!n) tFirst = now;
        tLast = now;
        n += k;
      }
    }
  }
  return { n, ttft: (tFirst - t0) / 1000, tpot: n > 1 ? (tLast - tFirst) / 1000 / (n - 1) : 0 };
}

const pct = (xs, p) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length ? s[Math.min(s.length - 1, Math.floor(p / 100 * s.length))] : 0;
};
const t0 = performance.now();
const results = (await Promise.all(Array.from({ length: streams }, async () => {
  const out = [];
  for (let i = 0; i < perStream; i++) out.push(await one());
  return out;
}))).flat();
const wall = (performance.now() - t0) / 1000;
const total = results.reduce((a, r) => a + r.n, 0);
const ttft = results.map((r) => r.ttft), tpot = results.map((r) => r.tpot);
const out = {
  streams, requests: results.length, prompt: promptLen, gen, wall_s: +wall.toFixed(3), tokens: total,
  aggregate_tok_s: +(total / wall).toFixed(2),
  ttft_p50_ms: +(pct(ttft, 50) * 1000).toFixed(1), ttft_p90_ms: +(pct(ttft, 90) * 1000).toFixed(1),
  tpot_p50_ms: +(pct(tpot, 50) * 1000).toFixed(2), tpot_p90_ms: +(pct(tpot, 90) * 1000).toFixed(2),
};
if (args.json) console.log(JSON.stringify(out));
else console.log(`${streams} streams x ${perStream}: ${total} tokens in ${out.wall_s} s = ${out.aggregate_tok_s} tok/s; ` +
  `TTFT p50 ${out.ttft_p50_ms} ms p90 ${out.ttft_p90_ms} ms; TPOT p50 ${out.tpot_p50_ms} ms p90 ${out.tpot_p90_ms} ms`);
