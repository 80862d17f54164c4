"""The security headers of every answer the workbench service sends, set in one place (a tornado transform).

Pages, API answers, errors, redirects, the OAuth callback, 404s for paths no
route serves, static files and the metrics all leave through the
application's output transforms, so ``SecurityHeaders`` (added by
``make_app``) reaches every one, whichever handler wrote it and whatever it
set or cleared before (an error page clears a handler's headers first):

* ``Content-Security-Policy``: no page of the service may be framed
  (``frame-ancestors 'none'``: a page of another site showing the fleet page
  with its Drain buttons under an invisible frame gets nothing); scripts only
  from the service itself (``script-src 'self'``: the pages carry no inline
  script, their code is in ``static/``, so an injected ``<script>`` or event
  handler attribute does not run even where escaping failed); fetches, forms
  and the rest from the same origin; no plugins, no ``<base>``. Inline
  styles stay allowed: the pages size their utilization bars with them, and
  a style cannot run code.
* ``X-Frame-Options: DENY``: the same for browsers that predate
  ``frame-ancestors``.
* ``X-Content-Type-Options: nosniff``: a JSON answer (which may echo a name)
  is never read as HTML or script.
* ``Referrer-Policy: same-origin``: a link out of the service does not tell
  another site the page's address (its query may name a user or a group).

JupyterHub sends ``frame-ancestors 'none'`` on its own pages (4.1 and later);
these are its rules for the service, a little stricter.
"""

from __future__ import annotations

from tornado.httputil import HTTPHeaders
from tornado.web import OutputTransform

CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self' 'unsafe-inline'",
        "img-src 'self' data:",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)

SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}


class SecurityHeaders(OutputTransform):
    """Adds ``SECURITY_HEADERS`` to the first chunk of every response (replacing any a handler set)."""

    def transform_first_chunk(
        self, status_code: int, headers: HTTPHeaders, chunk: bytes, finishing: bool
    ) -> tuple[int, HTTPHeaders, bytes]:
        for name, value in SECURITY_HEADERS.items():
            headers[name] = value
        return status_code, headers, chunk
