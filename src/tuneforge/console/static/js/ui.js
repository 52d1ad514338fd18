// What every view shares: the polite status line (aria-live), the error banner, and
// buttons that show they are busy.

import {ApiError} from "./api.js";

const statusNode = () => document.getElementById("status");
const errorNode = () => document.getElementById("error");

/** Say `text` in the status line (screen readers announce it). */
export function announce(text) {
  const node = statusNode();
  // cleared first so that the same message twice is announced twice
  node.textContent = "";
  window.setTimeout(() => { node.textContent = text; }, 20);
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
