// The client-side router: views live in the URL's fragment (#/jobs/ftjob-…), so the
// control plane serves one page and the browser's back button works.

const routes = [];

/** Register `pattern` ("/jobs/:jobId") for `view(params, query)`. */
export function route(pattern, view) {
  const names = [];
  const source = pattern.replace(/:([A-Za-z]+)/g, (_, name) => {
    names.push(name);
    return "([^/]+)";
  });
  routes.push({regex: new RegExp(`^${source}$`), names, view});
}

/** The current fragment as [path, URLSearchParams]. */
export function current() {
  const hash = window.location.hash.startsWith("#/") ? window.location.hash.slice(1) : "/";
  const [path, search = ""] = hash.split("?");
  return [path, new URLSearchParams(search)];
}

export function match(path) {
  for (const candidate of routes) {
    const found = candidate.regex.exec(path);
    if (found) {
      const params = {};
      candidate.names.forEach((name, index) => { params[name] = decodeURIComponent(found[index + 1]); });
      return {view: candidate.view, params};
    }
  }
  return null;
}

export function go(path) {
  if (window.location.hash === `#${path}`) window.dispatchEvent(new HashChangeEvent("hashchange"));
  else window.location.hash = path;
}

/** A fragment link to `path` with each dynamic segment encoded. */
export function href(...segments) {
  return "#/" + segments.map((segment) => encodeURIComponent(segment)).join("/");
}
