"""The dashboard: server-rendered pages at ``/`` over the same authorization and audit as
the REST API.

- **Login.** A form posts an API token. The server checks it, keeps it in a server-side
  session (in memory, never in a page) and sets an opaque session id as an HttpOnly,
  SameSite=Strict cookie. Every request authenticates the token again, so a revoked
  token ends its sessions at once.
- **CSRF.** Each session has a random CSRF token, rendered into every form; a POST
  without the matching token is refused (403) before anything else happens.
- **Targets.** Every URL is built from path segments encoded one by one, and every form
  names the path it posts to: a POST that arrives anywhere else (a browser rewrote the
  URL) is refused, so no name can turn one button into another.
- **CSP.** Every page is sent with a Content-Security-Policy that allows only 'self'
  (no inline script or style), and all job data is escaped by Jinja2's autoescape.
- **Actions** call the API's route functions with a :class:`Caller` made by
  :func:`~tether.web.security.authorize`: same roles, same audit rows.
"""

from tether.web.dashboard.install import install

__all__ = ["install"]
