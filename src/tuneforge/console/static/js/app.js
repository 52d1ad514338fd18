// The console's shell: sign-in state, the navigation, and rendering the view the URL's
// fragment names. Each view is `async (main, params, query, view) => void`; `view.onLeave`
// registers clean-up (an open event stream) run when the user moves on.

import {ApiError, session} from "./api.js";
import {h, fill} from "./dom.js";
import {current, match, route, go} from "./router.js";
import {clearError, messageOf, resetStatus, showError} from "./ui.js";
import {signInView} from "./views/signin.js";
import {jobsView} from "./views/jobs.js";
import {jobView} from "./views/job.js";
import {createJobView} from "./views/create.js";
import {filesView, datasetView} from "./views/files.js";
import {modelsView, modelView} from "./views/models.js";
import {routesView, routeView} from "./views/routes.js";
import {sweepsView, sweepView} from "./views/sweeps.js";
import {usageView} from "./views/usage.js";
import {playgroundView} from "./views/playground.js";
import {tenantsView, queueView, adminUsageView} from "./views/admin.js";

const TENANT_NAV = [["#/jobs", "Jobs"], ["#/jobs/new", "New job"], ["#/sweeps", "Sweeps"], ["#/files", "Files"],
  ["#/models", "Models"], ["#/routes", "Routes"], ["#/usage", "Usage"], ["#/playground", "Playground"]];
const ADMIN_NAV = [["#/admin/tenants", "Tenants"], ["#/admin/queue", "Queue"], ["#/admin/usage", "Usage"]];

const tenantRoutes = [
  ["/jobs", jobsView], ["/jobs/new", createJobView], ["/jobs/:jobId", jobView],
  ["/files", filesView], ["/files/:fileId", datasetView],
  ["/models", modelsView], ["/models/:modelId", modelView],
  ["/routes", routesView], ["/routes/:name", routeView],
  ["/sweeps", sweepsView], ["/sweeps/:sweepId", sweepView],
  ["/usage", usageView], ["/playground", playgroundView],
];
const adminRoutes = [["/admin/tenants", tenantsView], ["/admin/queue", queueView], ["/admin/usage", adminUsageView]];
for (const [pattern, view] of [...tenantRoutes, ...adminRoutes]) route(pattern, view);
const ADMIN_VIEWS = new Set(adminRoutes.map(([, view]) => view));

let leaving = [];
let renderCount = 0;

function home() {
  return session.role() === "admin" ? "/admin/tenants" : "/jobs";
}

function renderNav() {
  const nav = document.getElementById("nav");
  const role = session.role();
  const signOut = document.getElementById("sign-out");
  const who = document.getElementById("who");
  if (!role) {
    nav.hidden = true;
    signOut.hidden = true;
    who.textContent = "";
    return;
  }
  const [path] = current();
  const links = (role === "admin" ? ADMIN_NAV : TENANT_NAV).map(([target, text]) => {
    const active = path === target.slice(1) || (target === "#/jobs" && /^\/jobs\/(?!new)/.test(path)) ||
      (target !== "#/jobs" && target !== "#/jobs/new" && path.startsWith(target.slice(1) + "/"));
    return h("li", null, h("a", {href: target, "aria-current": active ? "page" : null}, text));
  });
  fill(nav, h("ul", null, links));
  nav.hidden = false;
  signOut.hidden = false;
  who.textContent = role === "admin" ? "Operator" : "Tenant";
}

function leave() {
  for (const clean of leaving) {
    try { clean(); } catch { /* a clean-up that fails must not stop the next view */ }
  }
  leaving = [];
}

async function render({focus = true} = {}) {
  leave();
  clearError();
  resetStatus();
  renderCount += 1;
  const mine = renderCount;
  const main = document.getElementById("main");
  renderNav();
  if (!session.key()) {
    signInView(main, () => { go(home()); });
    return;
  }
  const [path, query] = current();
  const found = match(path);
  if (!found) {
    go(home());
    return;
  }
  const isAdminView = ADMIN_VIEWS.has(found.view);
  if (isAdminView !== (session.role() === "admin")) {
    fill(main, h("h1", {tabindex: "-1"}, "Not available"),
      h("p", null, isAdminView ? "This page needs the operator's admin key." :
        "The operator's admin key sees the operator's pages only; sign in with a tenant's API key for this page."),
      h("p", null, h("a", {href: `#${home()}`}, "Go to the start page")));
    return;
  }
  // Each render draws into its own box: a view still loading when the URL changes (a slow list
  // behind a link already followed) can only fill a box that is no longer on the page.
  const box = h("div", {class: "view"}, h("p", {class: "muted"}, "Loading…"));
  fill(main, box);
  const context = {onLeave: (clean) => leaving.push(clean), isCurrent: () => mine === renderCount};
  try {
    await found.view(box, found.params, query, context);
  } catch (error) {
    if (mine !== renderCount) return;
    if (error instanceof ApiError && error.status === 401) {
      session.signOut();
      renderNav();
      signInView(main, () => { go(home()); }, messageOf(error));
      return;
    }
    fill(main, h("h1", {tabindex: "-1"}, "Could not load this page"));
    showError(error);
  }
  if (focus && mine === renderCount) {
    const heading = main.querySelector("h1");
    if (heading) {
      heading.setAttribute("tabindex", "-1");
      heading.focus({preventScroll: false});
    }
  }
}

function start() {
  document.getElementById("sign-out").addEventListener("click", () => {
    leave();
    session.signOut();
    window.location.hash = "#/";
    render();
  });
  document.getElementById("skip-link").addEventListener("click", (event) => {
    event.preventDefault();
    document.getElementById("main").focus();
  });
  window.addEventListener("hashchange", () => render());
  window.addEventListener("unhandledrejection", (event) => {
    showError(event.reason);
    event.preventDefault();
  });
  render({focus: false});
}

start();
