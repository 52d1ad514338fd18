// Sign-in with an API key. The operator's admin key is told apart by GET /v1/admin/tenants
// answering 200; a tenant's key must answer GET /v1/models.

import {probe, session} from "../api.js";
import {h, fill, field} from "../dom.js";
import {announce} from "../ui.js";

export function signInView(main, onSignedIn, notice = "") {
  const keyInput = h("input", {type: "password", name: "api-key", autocomplete: "off", spellcheck: "false",
    required: true, "aria-required": "true"});
  const error = h("p", {class: "form-error", id: "signin-error", role: "alert", hidden: !notice}, notice);
  keyInput.setAttribute("aria-errormessage", error.id);
  const submit = h("button", {type: "submit"}, "Sign in");
  const form = h("form", {class: "signin", "aria-labelledby": "signin-title", novalidate: true},
    field("API key", keyInput, "A tenant's key (tf-…) or the operator's admin key. It is kept in this tab only " +
      "and forgotten when the tab closes."),
    error, submit);

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const key = keyInput.value.trim();
    if (!key) {
      error.textContent = "Enter an API key.";
      error.hidden = false;
      keyInput.setAttribute("aria-invalid", "true");
      keyInput.focus();
      return;
    }
    submit.disabled = true;
    submit.setAttribute("aria-busy", "true");
    announce("Signing in…");
    try {
      const admin = await probe("/v1/admin/tenants", key);
      let role = admin.status === 200 ? "admin" : null;
      let refusal = null;
      if (!role) {
        const tenant = await probe("/v1/models", key);
        if (tenant.status === 200) role = "tenant";
        else refusal = tenant.error;
      }
      if (!role) {
        error.textContent = refusal ? refusal.message : "This key was not accepted.";
        error.hidden = false;
        keyInput.setAttribute("aria-invalid", "true");
        keyInput.focus();
        announce("Sign-in failed.");
        return;
      }
      keyInput.value = "";
      session.signIn(key, role);
      announce(role === "admin" ? "Signed in as the operator." : "Signed in.", {carry: true});
      onSignedIn(role);
    } finally {
      submit.disabled = false;
      submit.removeAttribute("aria-busy");
    }
  });

  fill(main,
    h("h1", {id: "signin-title", tabindex: "-1"}, "Sign in"),
    h("p", {class: "muted"}, "Sign in with an API key to see your fine-tuning jobs, datasets and models."),
    form);
  keyInput.focus();
}
