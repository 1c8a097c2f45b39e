// The chat a UI framework would hold, for the scripts that drive the real AI SDK client against
// `harness serve`: plain arrays for its state, change listeners, and a promise per finished request.
import { AbstractChat } from 'ai';

class ChatState {
  #status = 'ready';
  error = undefined;
  messages = [];
  listeners = new Set();
  get status() { return this.#status; }
  set status(value) { this.#status = value; this.changed(); }
  changed = () => { for (const listener of [...this.listeners]) listener(); };
  pushMessage = message => { this.messages = [...this.messages, message]; this.changed(); };
  popMessage = () => { this.messages = this.messages.slice(0, -1); this.changed(); };
  replaceMessage = (index, message) => {
    this.messages = this.messages.map((old, i) => (i === index ? message : old));
    this.changed();
  };
  snapshot = value => structuredClone(value);
}

export class Chat extends AbstractChat {
  constructor(options) {
    const state = new ChatState();
    const finishes = [];
    super({ ...options, state, onFinish: event => { finishes.splice(0).forEach(resolve => resolve(event)); } });
    this.chatState = state;
    this.finishes = finishes;
  }

  /** Resolves once `condition()` holds, checked now and on every change of the chat. */
  until(condition) {
    return new Promise(resolve => {
      const check = () => {
        if (condition()) {
          this.chatState.listeners.delete(check);
          resolve();
        }
      };
      this.chatState.listeners.add(check);
      check();
    });
  }

  /** Resolves when the next request (a send, a resume, an automatic send) has finished. */
  nextFinish() {
    return new Promise(resolve => this.finishes.push(resolve));
  }
}
