// What every view shares: the polite status line (aria-live), the error banner, and
// buttons that show they are busy.

import {ApiError} from "./api.js";

const statusNode = () => document.getElementById("status");
const errorNode = () => document.getElementById("error");

let pendingStatus = null;
let carried = null;

/**
 * Say `text` in the status line (screen readers announce it). The line belongs to the page
 * that said it: moving to another page clears it, unless `carry` (a message about the move
 * itself, such as "Created job …" before its page opens) keeps it for the next page. `from`
 * is a node of the page that speaks: when an answer arrives after the user has moved on (the
 * node is no longer in the document), the message is dropped instead of landing on another page.
 */
export function announce(text, {carry = false, from = null} = {}) {
  if (from && !from.isConnected) return;
  const node = statusNode();
  // cleared first so that the same message twice is announced twice
  node.textContent = "";
  window.clearTimeout(pendingStatus);
  pendingStatus = window.setTimeout(() => { node.textContent = text; }, 20);
  carried = carry ? text : null;
}

/** A new page opens: the status line is its own (empty, or what the move carried to it). */
export function resetStatus() {
  const keep = carried;
  carried = null;
  window.clearTimeout(pendingStatus);
  statusNode().textContent = keep || "";
}

/** The message an error shows: the API's `error.message`, never a stack trace. */
export function messageOf(error) {
  if (error instanceof ApiError) return error.message;
  if (error && error.name === "AbortError") return "";
  return "Something went wrong in the console; reload the page and try again.";
}

export function showError(error) {
  const message = typeof error === "string" ? error : messageOf(error);
  if (!message) return;
  const node = errorNode();
  node.textContent = message;
  node.hidden = false;
}

export function clearError() {
  const node = errorNode();
  node.textContent = "";
  node.hidden = true;
}

/** Run `action` with `button` disabled and marked busy; errors go to the banner. */
export async function busy(button, action) {
  button.disabled = true;
  button.setAttribute("aria-busy", "true");
  clearError();
  try {
    return await action();
  } catch (error) {
    showError(error);
    return undefined;
  } finally {
    button.disabled = false;
    button.removeAttribute("aria-busy");
  }
}

/** An inline error next to a form, tied to it for assistive technology. */
export function inlineError(node, error) {
  node.textContent = error ? messageOf(error) : "";
  node.hidden = !error;
}

// How a sentence says each status: "Job … succeeded.", "Job … is running.", "Sweep … was cancelled."
const STATUS_PHRASES = {
  validating_files: "is validating its files", queued: "is queued", running: "is running",
  evaluating: "is being evaluated", pausing: "is pausing", paused: "is paused",
  succeeded: "succeeded", failed: "failed", cancelled: "was cancelled", completed: "has completed",
};

/** `subject` (e.g. "Job ftjob-1") and its status as a sentence. */
export function statusSentence(subject, status) {
  const phrase = STATUS_PHRASES[status] || `is ${String(status).replace(/_/g, " ")}`;
  return `${subject} ${phrase}.`;
}
