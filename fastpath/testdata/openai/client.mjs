// The official openai client, pointed at a kvfast router: run by
// fastpath's openai_test.go as `node client.mjs <router base URL>/v1`. It
// prints one JSON object of what the client saw, which the Go test checks.
// Any exception the client raises where none is expected fails the run.
import OpenAI from 'openai';

const baseURL = process.argv[2];
if (!baseURL) {
  console.error('usage: node client.mjs <base URL, e.g. http://127.0.0.1:8000/v1>');
  process.exit(2);
}
const client = new OpenAI({ baseURL, apiKey: 'kvfast-test-key', maxRetries: 0, timeout: 20_000 });
const prompt = Array.from({ length: 48 }, (_, i) => 1000 + 7 * i); // three 16-token blocks
const messages = [
  { role: 'system', content: 'You are terse.' },
  { role: 'user', content: 'Name three colours.' },
];
const out = {};

// Completions, not streamed, with the decision headers read off the raw response.
{
  const { data, response } = await client.completions
    .create({ model: 'mock', prompt, max_tokens: 6 }, { headers: { 'X-Request-Id': 'node-rid-1' } })
    .withResponse();
  out.completion = {
    object: data.object,
    text: data.choices[0].text,
    finish_reason: data.choices[0].finish_reason,
    usage: data.usage,
    worker: response.headers.get('x-kvfast-worker'),
    request_id: response.headers.get('x-request-id'),
  };
}

// Completions, streamed: the client's own SSE parser reads the relay.
{
  const { data: stream, response } = await client.completions
    .create({ model: 'mock', prompt, max_tokens: 6, stream: true })
    .withResponse();
  let text = '';
  let chunks = 0;
  let finish = null;
  for await (const chunk of stream) {
    chunks++;
    text += chunk.choices[0]?.text ?? '';
    finish = chunk.choices[0]?.finish_reason ?? finish;
  }
  out.completion_stream = { text, chunks, finish_reason: finish, worker: response.headers.get('x-kvfast-worker'),
    content_type: response.headers.get('content-type') };
}

// Chat, not streamed.
{
  const data = await client.chat.completions.create({ model: 'mock', messages, max_tokens: 5 });
  out.chat = { object: data.object, content: data.choices[0].message.content, role: data.choices[0].message.role,
    finish_reason: data.choices[0].finish_reason, usage: data.usage };
}

// Chat, streamed, with the usage chunk.
{
  const stream = await client.chat.completions.create({
    model: 'mock', messages, max_tokens: 5, stream: true, stream_options: { include_usage: true },
  });
  let content = '';
  let chunks = 0;
  let finish = null;
  let usage = null;
  for await (const chunk of stream) {
    chunks++;
    content += chunk.choices[0]?.delta?.content ?? '';
    finish = chunk.choices[0]?.finish_reason ?? finish;
    usage = chunk.usage ?? usage;
  }
  out.chat_stream = { content, chunks, finish_reason: finish, usage };
}

// The model list, and one model of it.
{
  const ids = [];
  for await (const m of client.models.list()) ids.push(m.id);
  const one = await client.models.retrieve('mock');
  out.models = { ids, retrieved: { id: one.id, object: one.object } };
}

// Refusals surface as the client's typed errors, with the router's fields.
async function refusal(call) {
  try {
    await call();
    return { thrown: false };
  } catch (err) {
    return {
      thrown: true,
      class: err?.constructor?.name ?? null,
      status: err?.status ?? null,
      type: err?.type ?? null,
      code: err?.code ?? null,
      param: err?.param ?? null,
      message: err?.message ?? null,
    };
  }
}
out.unknown_model = await refusal(() => client.completions.create({ model: 'no-such-model', prompt, max_tokens: 2 }));
out.empty_prompt = await refusal(() => client.completions.create({ model: 'mock', prompt: '', max_tokens: 2 }));
out.bad_token = await refusal(() => client.completions.create({ model: 'mock', prompt: [1, -5], max_tokens: 2 }));
out.unknown_model_retrieve = await refusal(() => client.models.retrieve('no-such-model'));
out.unknown_pin = await refusal(() =>
  client.completions.create({ model: 'mock', prompt, max_tokens: 2 }, { headers: { 'X-Kvfast-Worker': '999' } }));

console.log(JSON.stringify(out));
