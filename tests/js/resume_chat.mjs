// The real AI SDK client against `harness serve`: send a message with DefaultChatTransport, drop
// the connection mid-reply (the body fails as a broken network does and the socket is closed),
// resume with resumeStream(), and print the chat as JSON for the pytest test to check.
//
// usage: node resume_chat.mjs BASE_URL CONVERSATION_ID
import { DefaultChatTransport } from 'ai';

import { Chat } from './chat.mjs';

const [base, chatId] = process.argv.slice(2);

// A fetch whose response body can be broken from here, as a dropped connection breaks it.
let drop = () => { throw new Error('no stream to drop'); };
async function droppableFetch(url, init = {}) {
  const socket = new AbortController();
  const signal = init.signal ? AbortSignal.any([init.signal, socket.signal]) : socket.signal;
  const response = await fetch(url, { ...init, signal });
  if (response.body == null || response.status === 204) {
    return response;
  }
  const reader = response.body.getReader();
  let fail;
  const failed = new Promise((_, reject) => { fail = reject; });
  failed.catch(() => {});
  const body = new ReadableStream({
    async pull(controller) {
      const { done, value } = await Promise.race([reader.read(), failed]);
      if (done) controller.close(); else controller.enqueue(value);
    },
    cancel(reason) { return reader.cancel(reason); },
  });
  drop = () => {
    fail(new TypeError('network error: the connection dropped'));
    socket.abort();
  };
  return new Response(body, { status: response.status, headers: response.headers });
}

const errors = [];
const chat = new Chat({
  id: chatId,
  transport: new DefaultChatTransport({ api: `${base}/api/chat`, fetch: droppableFetch }),
  onError: error => errors.push(error.message),
});

const replyText = () => {
  const last = chat.lastMessage;
  return last?.role === 'assistant' ? last.parts.filter(p => p.type === 'text').map(p => p.text).join('') : '';
};

const sending = chat.sendMessage({ text: 'look it up' });
await chat.until(() => replyText().includes('First half.'));
drop();
await sending;
const afterDrop = { status: chat.status, errors: [...errors] };
await chat.resumeStream();
const afterResume = { status: chat.status, errors: [...errors] };
await chat.resumeStream(); // the turn has ended: 204, nothing changes
console.log(JSON.stringify({ afterDrop, afterResume, status: chat.status, messages: chat.messages }));
