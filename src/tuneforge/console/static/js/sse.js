// Server-Sent Events read from a fetch() body: EventSource cannot send the Authorization
// header, so the stream is read with a ReadableStream reader and its frames parsed here,
// as the SSE specification describes (fields `id`, `data`, `event`; comment lines start
// with ":"; a blank line ends a frame; \n, \r\n and \r all end a line).

/** An incremental parser: feed() text as it arrives, get back the frames it completed. */
export class FrameParser {
  constructor() {
    this.buffer = "";
    this.data = [];
    this.id = null;
    this.event = null;
  }

  feed(text) {
    this.buffer += text;
    const frames = [];
    // a lone "\r" at the very end may be the first half of "\r\n": keep it for the next chunk
    let cut;
    while ((cut = this.lineEnd()) !== null) {
      const [index, width] = cut;
      const line = this.buffer.slice(0, index);
      this.buffer = this.buffer.slice(index + width);
      const frame = this.line(line);
      if (frame) frames.push(frame);
    }
    return frames;
  }

  lineEnd() {
    const match = /\r\n|\n|\r/.exec(this.buffer);
    if (!match) return null;
    if (match[0] === "\r" && match.index === this.buffer.length - 1) return null;
    return [match.index, match[0].length];
  }

  line(line) {
    if (line === "") {
      if (!this.data.length) {
        this.event = null;
        return null;
      }
      const frame = {id: this.id, event: this.event || "message", data: this.data.join("\n")};
      this.data = [];
      this.event = null;
      return frame;
    }
    if (line.startsWith(":")) return null;
    const colon = line.indexOf(":");
    const name = colon === -1 ? line : line.slice(0, colon);
    let value = colon === -1 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (name === "data") this.data.push(value);
    else if (name === "id") this.id = value;
    else if (name === "event") this.event = value;
    return null;
  }
}

/**
 * Read the SSE stream of `response` to its end. `onFrames` gets each batch of frames the
 * network delivered together. Resolves to true when the stream said `data: [DONE]`.
 */
export async function readFrames(response, onFrames, signal) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  const parser = new FrameParser();
  try {
    for (;;) {
      if (signal && signal.aborted) return false;
      const {value, done} = await reader.read();
      if (done) return false;
      const frames = parser.feed(decoder.decode(value, {stream: true}));
      const finished = frames.findIndex((frame) => frame.data === "[DONE]");
      const delivered = finished === -1 ? frames : frames.slice(0, finished);
      if (delivered.length) onFrames(delivered);
      if (finished !== -1) return true;
    }
  } finally {
    reader.releaseLock();
  }
}
