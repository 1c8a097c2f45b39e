// The real AI SDK client across a restart of `harness serve`: send a message with
// DefaultChatTransport; once the reply shows FIRST_TEXT print `cut` and wait for a line on stdin
// (meanwhile the test kills the server and starts it again on the same port, so the stream fails
// as a crash fails it); then resume with resumeStream(), print `resumed` once the resumed stream
// streams, and at its end print the chat as JSON for the pytest test to check.
//
// usage: node restart_chat.mjs BASE_URL CONVERSATION_ID FIRST_TEXT
import { createInterface } from 'node:readline';

import { DefaultChatTransport } from 'ai';

import { Chat } from './chat.mjs';

const [base, chatId, firstText] = process.argv.slice(2);
const stdin = createInterface({ input: process.stdin })[Symbol.asyncIterator]();

const errors = [];
const chat = new Chat({
  id: chatId,
  transport: new DefaultChatTransport({ api: `${base}/api/chat` }),
  onError: error => errors.push(error.message),
});

const replyText = () => {
  const last = chat.lastMessage;
  return last?.role === 'assistant' ? last.parts.filter(p => p.type === 'text').map(p => p.text).join('') : '';
};

const sending = chat.sendMessage({ text: 'Tell me a long answer.' });
await chat.until(() => replyText().includes(firstText));
const cut = { messageId: chat.lastMessage.id, text: replyText() };
console.log('cut');
await sending; // the server was killed: the stream failed
const afterCut = { status: chat.status, errors: [...errors] };
await stdin.next(); // the server is serving again
const resuming = chat.resumeStream();
await chat.until(() => chat.status === 'streaming');
console.log('resumed');
await resuming;
console.log(JSON.stringify({ cut, afterCut, status: chat.status, errors, messages: chat.messages }));
process.exit(0); // stdin stays open
