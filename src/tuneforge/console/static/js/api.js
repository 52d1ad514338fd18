// The platform's HTTP API, as the console uses it. The API key lives in this tab's
// sessionStorage only: it goes in the Authorization header, never in a URL, a log or
// localStorage, and it is gone when the tab closes or the user signs out.

import {readFrames} from "./sse.js";

const KEY_SLOT = "tuneforge.apiKey";
const ROLE_SLOT = "tuneforge.role";

export const session = {
  key: () => sessionStorage.getItem(KEY_SLOT),
  role: () => sessionStorage.getItem(ROLE_SLOT),
  signIn(key, role) {
    sessionStorage.setItem(KEY_SLOT, key);
    sessionStorage.setItem(ROLE_SLOT, role);
  },
  signOut() {
    sessionStorage.removeItem(KEY_SLOT);
    sessionStorage.removeItem(ROLE_SLOT);
  },
};

/** An error the API answered with: its `error.message`, status and code. */
export class ApiError extends Error {
  constructor(status, message, code = null, param = null) {
    super(message);
    this.name = "ApiError";
    this.status = status;
    this.code = code;
    this.param = param;
  }
}

function authHeaders(key = session.key()) {
  return key ? {Authorization: `Bearer ${key}`} : {};
}

/** The ApiError of a failed answer, from OpenAI's envelope when it has one. */
async function failure(response) {
  let message = `The request failed (HTTP ${response.status}).`;
  let code = null;
  let param = null;
  try {
    const body = await response.json();
    if (body && body.error && typeof body.error.message === "string") {
      ({message, code = null, param = null} = body.error);
    }
  } catch {
    // not JSON: keep the generic message (a proxy's page is not shown to the user)
  }
  return new ApiError(response.status, message, code, param);
}

function withQuery(path, query) {
  if (!query) return path;
  const params = new URLSearchParams();
  for (const [name, value] of Object.entries(query)) {
    if (value !== undefined && value !== null && value !== "") params.append(name, String(value));
  }
  const text = params.toString();
  return text ? `${path}?${text}` : path;
}

/** Call the API; resolves to the parsed JSON body, or throws an ApiError. */
export async function api(method, path, {body, query, key, signal} = {}) {
  const headers = authHeaders(key);
  const init = {method, headers, signal, cache: "no-store", credentials: "omit"};
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(withQuery(path, query), init);
  } catch (error) {
    if (error.name === "AbortError") throw error;
    throw new ApiError(0, "The platform could not be reached; check the connection and try again.");
  }
  if (!response.ok) throw await failure(response);
  if (response.status === 204) return null;
  return response.json();
}

export const get = (path, query, options = {}) => api("GET", path, {...options, query});
export const post = (path, body, options = {}) => api("POST", path, {...options, body});

/** Status of a GET with `key`, without throwing: how sign-in tells admin keys from tenant keys. */
export async function probe(path, key) {
  try {
    const response = await fetch(path, {headers: authHeaders(key), cache: "no-store", credentials: "omit"});
    if (response.ok) return {status: response.status, error: null};
    return {status: response.status, error: await failure(response)};
  } catch {
    return {status: 0, error: new ApiError(0, "The platform could not be reached; check the connection and try again.")};
  }
}

/**
 * Upload a file for fine-tuning with progress: XMLHttpRequest, since fetch() reports no
 * upload progress. `onProgress(sentBytes, totalBytes)`. Resolves to the File object.
 */
export function uploadFile(file, purpose, onProgress) {
  return new Promise((resolve, reject) => {
    const request = new XMLHttpRequest();
    request.open("POST", "/v1/files");
    const key = session.key();
    if (key) request.setRequestHeader("Authorization", `Bearer ${key}`);
    request.responseType = "json";
    request.upload.addEventListener("progress", (event) => {
      if (event.lengthComputable) onProgress(event.loaded, event.total);
    });
    request.addEventListener("load", () => {
      const body = request.response;
      if (request.status >= 200 && request.status < 300) {
        onProgress(file.size, file.size);
        resolve(body);
      } else {
        const error = body && body.error ? body.error : {};
        reject(new ApiError(request.status, error.message || `The upload failed (HTTP ${request.status}).`,
          error.code || null, error.param || null));
      }
    });
    request.addEventListener("error", () => reject(new ApiError(0, "The upload was interrupted; try again.")));
    request.addEventListener("abort", () => reject(new ApiError(0, "The upload was cancelled.")));
    const form = new FormData();
    form.append("purpose", purpose);
    form.append("file", file, file.name);
    request.send(form);
  });
}

/**
 * A fine-tune file is validated in the background: poll it while its status is `processing`,
 * calling `onProgress(file)` with each answer (`file.validation` holds rows and bytes checked),
 * until it is processed or error. Stops early, resolving to null, once `stillWanted()` is false
 * (the user left the page). Resolves to the File object.
 */
export async function waitProcessed(file, onProgress, {stillWanted = () => true, intervalMs = 500} = {}) {
  let current = file;
  while (current && current.status === "processing") {
    await new Promise((done) => setTimeout(done, intervalMs));
    if (!stillWanted()) return null;
    current = await get(`/v1/files/${encodeURIComponent(current.id)}`);
    onProgress(current);
  }
  return current;
}

/** Download an authenticated artifact: fetched as a blob, then saved under its own name. */
export async function download(path, query, fallbackName) {
  const response = await fetch(withQuery(path, query), {headers: authHeaders(), cache: "no-store", credentials: "omit"});
  if (!response.ok) throw await failure(response);
  const blob = await response.blob();
  const disposition = response.headers.get("Content-Disposition") || "";
  const exact = /filename\*=UTF-8''([^;]+)/i.exec(disposition);
  const plain = /filename="([^"]+)"/i.exec(disposition);
  const name = exact ? decodeURIComponent(exact[1]) : plain ? plain[1] : fallbackName;
  const url = URL.createObjectURL(blob);
  const link = document.createElement("a");
  link.href = url;
  link.download = name;
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 30_000);
  return {name, size: blob.size};
}

/**
 * Follow a job's events (`?stream=true`): every event oldest first, then live ones.
 * `onEvents(list)` gets each batch as it arrives; `onEnd(finished)` once the job has
 * finished (true) or following stopped on an error it could not recover from (false).
 * A dropped connection resumes after the last event seen (Last-Event-ID), so nothing is
 * repeated or missed. Returns a function that stops following.
 */
export function followJobEvents(jobId, {onEvents, onEnd, onError}) {
  const controller = new AbortController();
  let lastEventId = null;
  let retries = 0;

  async function once() {
    const headers = {...authHeaders(), Accept: "text/event-stream"};
    if (lastEventId) headers["Last-Event-ID"] = lastEventId;
    const response = await fetch(`/v1/fine_tuning/jobs/${encodeURIComponent(jobId)}/events?stream=true`,
      {headers, cache: "no-store", credentials: "omit", signal: controller.signal});
    if (!response.ok) throw await failure(response);
    return readFrames(response, (frames) => {
      retries = 0;
      const events = [];
      for (const frame of frames) {
        if (frame.id) lastEventId = frame.id;
        try {
          events.push(JSON.parse(frame.data));
        } catch {
          // a frame that is not an event object is not shown
        }
      }
      if (events.length) onEvents(events);
    }, controller.signal);
  }

  (async () => {
    while (!controller.signal.aborted) {
      try {
        if (await once()) {
          onEnd(true);
          return;
        }
      } catch (error) {
        if (controller.signal.aborted) return;
        const permanent = error instanceof ApiError && error.status >= 400 && error.status < 500 && error.status !== 429;
        if (permanent || retries >= 5) {
          if (onError) onError(error);
          onEnd(false);
          return;
        }
      }
      if (controller.signal.aborted) return;
      retries += 1;
      await new Promise((resolve) => setTimeout(resolve, Math.min(8000, 500 * 2 ** retries)));
    }
  })();
  return () => controller.abort();
}

/** Every page of a cursor-paged list (`after` = the last id), up to `max` items. */
export async function allPages(path, query = {}, max = 1000) {
  const items = [];
  let after;
  for (;;) {
    const page = await get(path, {...query, after});
    items.push(...page.data);
    if (!page.has_more || !page.data.length || items.length >= max) return items;
    after = page.last_id || page.data[page.data.length - 1].id;
  }
}
