// The real AI SDK client sending one message to `harness serve` and reading its whole stream;
// prints the types of the parts the server sent and the chat the client built from them, as JSON
// for the pytest test to check.
//
// usage: node send_chat.mjs BASE_URL CONVERSATION_ID
import { DefaultChatTransport } from 'ai';

import { Chat } from './chat.mjs';

const [base, chatId] = process.argv.slice(2);

// A fetch that keeps a copy of the response body, to tell which parts came over the wire.
const bodies = [];
async function copyingFetch(url, init) {
  const response = await fetch(url, init);
  const [copy, body] = response.body.tee();
  bodies.push(new Response(copy).text());
  return new Response(body, { status: response.status, headers: response.headers });
}

const errors = [];
const chat = new Chat({
  id: chatId,
  transport: new DefaultChatTransport({ api: `${base}/api/chat`, fetch: copyingFetch }),
  onError: error => errors.push(error.message),
});
await chat.sendMessage({ text: 'look it up' });
const sent = (await Promise.all(bodies)).flatMap(body => body.split('\n'))
  .filter(line => line.startsWith('data: {')).map(line => JSON.parse(line.slice(6)).type);
console.log(JSON.stringify({ sent, status: chat.status, errors, messages: chat.messages }));
