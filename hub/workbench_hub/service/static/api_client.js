// One client for the service's API, shared by every section of a page: same-origin cookie, the XSRF token,
// JSON in and out, and an Error carrying the service's sentence when the answer is not 2xx. The prefix and
// the token come from the page's <body data-prefix data-xsrf> (no inline script: the service's CSP allows
// scripts from its own static files only, see headers.py).
window.workbenchApi = (function () {
  "use strict";
  var prefix = document.body.dataset.prefix || "";
  var xsrf = document.body.dataset.xsrf || "";
  return function (method, path, body) {
    var options = {method: method, credentials: "same-origin",
                   headers: {"X-XSRFToken": xsrf, "Accept": "application/json"}};
    if (body !== undefined) { options.headers["Content-Type"] = "application/json"; options.body = JSON.stringify(body); }
    return fetch(prefix + path, options).then(function (r) {
      if (r.status === 204) { return {}; }
      return r.json().then(function (data) {
        if (!r.ok) { throw new Error(data.message || ("HTTP " + r.status)); }
        return data;
      });
    });
  };
})();

// Whether the page may act: a page rendered for an admin carries <body data-admin="true">.
window.workbenchAdmin = document.body.dataset.admin === "true";

// Ask before an action that stops servers or takes something away; the sentence says what will happen.
// A plain confirm(): the browser's own dialog, which Chromium tests answer through Playwright's "dialog" event.
window.workbenchConfirm = function (sentence) {
  "use strict";
  return window.confirm(sentence);
};
