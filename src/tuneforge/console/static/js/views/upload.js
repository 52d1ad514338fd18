// Uploading a fine-tuning file with a progress bar; shared by the files page and the
// create-job form.

import {uploadFile, waitProcessed} from "../api.js";
import {h, field, formatNumber} from "../dom.js";
import {href} from "../router.js";
import {announce, messageOf} from "../ui.js";

/** The upload control; `onUploaded(file)` gets the File object the API answered with. */
export function uploadControl(onUploaded, {label = "Training data file"} = {}) {
  const input = h("input", {type: "file", name: "upload", accept: ".jsonl,.json,.csv,.parquet,.gz,.zip,.tar,.tgz"});
  const button = h("button", {type: "button", class: "secondary"}, "Upload");
  const bar = h("progress", {max: 100, value: 0, "aria-label": "Upload progress", "data-testid": "upload-progress", hidden: true});
  const note = h("p", {class: "muted upload-note", "aria-live": "polite", "data-testid": "upload-note"});

  button.addEventListener("click", async () => {
    const file = input.files && input.files[0];
    if (!file) {
      note.textContent = "Choose a file first.";
      input.focus();
      return;
    }
    button.disabled = true;
    bar.hidden = false;
    bar.value = 0;
    note.textContent = `Uploading ${file.name}…`;
    try {
      const sent = await uploadFile(file, "fine-tune", (done, total) => {
        bar.max = total || 1;
        bar.value = done;
        bar.setAttribute("aria-valuetext", `${Math.round((100 * done) / (total || 1))}%`);
      });
      const uploaded = sent.status === "processing" ? await validated(sent) : sent;
      if (!uploaded) return;  // the user left the page meanwhile
      note.replaceChildren();
      if (uploaded.status === "error") {
        note.append(h("span", {class: "form-error"}, `${uploaded.filename} was stored but did not pass validation: `,
          uploaded.status_details || "see its report", ". "), h("a", {href: href("files", uploaded.id)}, "Open the report"));
        announce(`${uploaded.filename} did not pass validation.`, {from: note});
      } else {
        note.append(`Uploaded ${uploaded.filename} (${formatNumber(uploaded.bytes)} bytes) as `,
          h("a", {href: href("files", uploaded.id), "data-testid": "uploaded-file"}, uploaded.id), ".");
        announce(`Uploaded ${uploaded.filename}.`, {from: note});
      }
      input.value = "";
      onUploaded(uploaded);
    } catch (error) {
      note.replaceChildren(h("span", {class: "form-error", role: "alert"}, messageOf(error)));
    } finally {
      button.disabled = false;
    }
  });

  /** Validation goes on in the background: the bar follows the bytes checked until it ends. */
  function validated(file) {
    bar.value = 0;
    const show = (current) => {
      const progress = current.validation || {};
      bar.max = progress.bytes_total || 1;
      bar.value = progress.bytes_checked || 0;
      bar.setAttribute("aria-valuetext", `${Math.round(progress.percent || 0)}%`);
      note.textContent = `Validating ${current.filename}… ${formatNumber(progress.rows_checked || 0)} rows checked ` +
        `(${Math.round(progress.percent || 0)}%).`;
    };
    show(file);
    note.setAttribute("data-status", "processing");
    return waitProcessed(file, show, {stillWanted: () => note.isConnected}).finally(() => note.removeAttribute("data-status"));
  }

  return h("div", {class: "upload"},
    h("div", {class: "row"}, field(label, input, "JSONL (chat, prompt/completion, preference or text lines), CSV or Parquet."), button),
    bar, note);
}
