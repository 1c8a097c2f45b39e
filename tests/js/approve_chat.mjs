// The real AI SDK client answering tool approvals from `harness serve`: each message's stream ends
// at the call waiting for approval; addToolApprovalResponse answers it (approved, then denied with
// a reason) and sendAutomaticallyWhen sends the answer, whose stream finishes the same message.
// Prints what the chat held at each pause and at the end, as JSON for the pytest test to check.
//
// usage: node approve_chat.mjs BASE_URL CONVERSATION_ID
import { DefaultChatTransport, lastAssistantMessageIsCompleteWithApprovalResponses } from 'ai';

import { Chat } from './chat.mjs';

const [base, chatId] = process.argv.slice(2);

const errors = [];
const chat = new Chat({
  id: chatId,
  transport: new DefaultChatTransport({ api: `${base}/api/chat` }),
  sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithApprovalResponses,
  onError: error => errors.push(error.message),
});

const waiting = () => chat.lastMessage?.parts.find(part => part.state === 'approval-requested');

async function turn(text, approved, reason) {
  await chat.sendMessage({ text });
  const asked = waiting();
  const paused = { status: chat.status, messageId: chat.lastMessage.id, tool: structuredClone(asked) };
  const answered = chat.nextFinish();
  await chat.addToolApprovalResponse({ id: asked.approval.id, approved, reason });
  const { finishReason } = await answered;
  return { paused, finishReason, status: chat.status };
}

const approved = await turn('look it up', true);
const denied = await turn('and the other one', false, 'not that one');
console.log(JSON.stringify({ approved, denied, errors, messages: chat.messages }));
