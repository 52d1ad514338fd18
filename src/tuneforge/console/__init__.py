"""The web console: a single-page application served by the control plane at /console.

Every asset (HTML, CSS, ES modules) ships in this package under `static/`; the page loads
nothing from any other origin and talks to the platform only through its public HTTP API,
with the API key the user signs in with (kept in the tab's sessionStorage).
"""

from tuneforge.console.routes import CONSOLE_CSP, install

__all__ = ["CONSOLE_CSP", "install"]
