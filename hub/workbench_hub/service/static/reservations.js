// Reservations on the fleet page (reservations_section.html): listed from api/reservations (text only, never
// HTML); admins create them, and delete one after a confirmation.
(function () {
  "use strict";
  var admin = window.workbenchAdmin;
  var call = window.workbenchApi;
  function cell(row, text) { var td = document.createElement("td"); td.textContent = text; row.appendChild(td); return td; }
  function say(text, ok) {
    var s = document.getElementById("reservation-status");
    if (s) { s.textContent = text; s.className = "mt-2 alert " + (ok === null ? "alert-secondary" : ok ? "alert-success" : "alert-danger"); }
  }
  function remove(r) {
    var what = r.group + ": " + r.gpus + (r.model ? " " + r.model : "") + " GPU" + (r.gpus === 1 ? "" : "s") + ", " +
      (r.weekly ? "weekly " : "") + r.window;
    if (!window.workbenchConfirm("Delete reservation #" + r.id + " (" + what + ")? Its GPUs go back to everyone; " +
        "servers running now are not stopped.")) {
      say("Not deleted: reservation #" + r.id + " stays.", null);
      return;
    }
    call("DELETE", "api/reservations/" + r.id).then(function () { say("Deleted reservation #" + r.id + ".", true); load(); })
      .catch(function (e) { say("Not deleted: " + e.message, false); });
  }
  function load() {
    call("GET", "api/reservations").then(function (data) {
      document.getElementById("reservation-zone").textContent = "(times in " + data.time_zone + ")";
      var body = document.getElementById("reservation-rows");
      body.textContent = "";
      if (!data.reservations.length) {
        var empty = document.createElement("tr"); cell(empty, "none").colSpan = 8; body.appendChild(empty);
      }
      data.reservations.forEach(function (r) {
        var row = document.createElement("tr");
        row.dataset.id = r.id;
        cell(row, r.id); cell(row, r.group); cell(row, r.gpus + (r.model ? " " + r.model : ""));
        cell(row, (r.weekly ? "weekly " : "") + r.window); cell(row, r.grace_minutes + " min");
        cell(row, r.preempt ? "yes, warned " + r.warn_minutes + " min before" : "no");
        cell(row, r.active ? "open now" : (r.next_start ? "next " + r.next_start.slice(0, 16).replace("T", " ") : "over"));
        if (admin) {
          var button = document.createElement("button");
          button.className = "btn btn-sm btn-outline-danger"; button.textContent = "Delete";
          button.addEventListener("click", function () { remove(r); });
          cell(row, "").appendChild(button);
        }
        body.appendChild(row);
      });
    }).catch(function (e) { say("Could not list reservations: " + e.message, false); });
  }
  load();
  var form = document.getElementById("reservation-form");
  if (!form) { return; }
  function value(id) { return document.getElementById(id).value.trim(); }
  form.addEventListener("submit", function (event) {
    event.preventDefault();
    var body = {group: value("reservation-group"), gpus: Number(value("reservation-gpus")), window: value("reservation-window"),
                preempt: document.getElementById("reservation-preempt").checked};
    if (value("reservation-model")) { body.model = value("reservation-model"); }
    if (value("reservation-grace") !== "") { body.grace_minutes = Number(value("reservation-grace")); }
    if (value("reservation-warn") !== "") { body.warn_minutes = Number(value("reservation-warn")); }
    call("POST", "api/reservations", body).then(function (r) { say("Reserved " + r.description + ".", true); load(); })
      .catch(function (e) { say("Not reserved: " + e.message, false); });
  });
})();
