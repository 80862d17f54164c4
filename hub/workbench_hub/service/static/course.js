// A course's page (course.html): its staff stop a student's server (after a confirmation), set or remove a
// student's quota within the ceiling, and import a roster, through the REST API; the API's sentence is shown
// as it is, and the page reloads after a change. Text only, never HTML.
(function () {
  "use strict";
  var api = window.workbenchApi;
  var course = document.getElementById("course-title").dataset.course;
  var base = "api/courses/" + encodeURIComponent(course) + "/students/";
  var status = document.getElementById("course-status");
  function say(text, ok) {
    status.textContent = text;
    status.className = "alert " + (ok === null ? "alert-secondary" : ok ? "alert-success" : "alert-danger");
  }
  function studentOf(element) { return element.closest("tr").dataset.student; }
  function reloadSoon() { window.setTimeout(function () { window.location.reload(); }, 1500); }

  document.querySelectorAll(".course-stop").forEach(function (button) {
    button.addEventListener("click", function () {
      var student = studentOf(button);
      var server = button.dataset.server;
      var what = (server ? "server " + server : "the default server") + " of " + student;
      if (!window.workbenchConfirm("Stop " + what + "? Open notebooks are saved first; " + student +
          " is told an instructor stopped it. Their files are kept.")) {
        say("Not stopped: " + what + " keeps running.", null);
        return;
      }
      say("Stopping " + what + " (saving open notebooks first)...", null);
      api("POST", base + encodeURIComponent(student) + "/stop", {server: server}).then(function (data) {
        say("Stopped " + what + ". " + student + " reads: " + data.message, true); reloadSoon();
      }).catch(function (e) { say("Not stopped: " + e.message, false); });
    });
  });

  document.querySelectorAll(".course-quota-form").forEach(function (form) {
    form.addEventListener("submit", function (event) {
      event.preventDefault();
      var student = studentOf(form);
      var body = {max_gpus: parseInt(form.elements.max_gpus.value, 10)};
      var hours = form.elements.gpu_hours_per_week.value.trim();
      if (hours !== "") { body.gpu_hours_per_week = parseFloat(hours); }
      api("PUT", base + encodeURIComponent(student) + "/quota", body).then(function (data) {
        var q = data.quota;
        say("Set " + student + "'s quota: " + q.max_gpus + " GPU(s)" +
            (q.gpu_hours_per_week === null ? "" : ", " + q.gpu_hours_per_week + " GPU-hours a week") +
            ". It applies to their next start.", true);
        reloadSoon();
      }).catch(function (e) { say("Not changed: " + e.message, false); });
    });
    form.querySelector(".course-unquota").addEventListener("click", function () {
      var student = studentOf(form);
      api("DELETE", base + encodeURIComponent(student) + "/quota").then(function () {
        say("Removed " + student + "'s own quota: their groups' quota or the hub's default applies.", true);
        reloadSoon();
      }).catch(function (e) { say("Not changed: " + e.message, false); });
    });
  });

  var roster = document.getElementById("course-roster-form");
  if (roster) {
    roster.addEventListener("submit", function (event) {
      event.preventDefault();
      var file = document.getElementById("course-roster-file").files[0];
      if (!file) { say("Choose the roster's CSV file first.", false); return; }
      file.text().then(function (text) {
        return api("POST", "api/courses/" + encodeURIComponent(course) + "/roster", {csv: text});
      }).then(function (data) {
        var origin = window.location.origin;
        var lines = data.rows.map(function (r) {
          return r.user + " (" + r.role + ", line " + r.line + "): " +
            r.first_login.replace("/hub/signup?", origin + "/hub/signup?");
        });
        var out = document.getElementById("course-roster-result");
        out.textContent = lines.join("\n");
        out.classList.remove("d-none");
        say("Roster applied: " + data.created + " account(s) made, " + data.joined + " student(s) joined, " +
            data.staff_added + " added to the staff. Hand out the first-login lines below (each link works once).", true);
      }).catch(function (e) { say("The roster was not applied: " + e.message.replace(/^the roster was not applied: /, ""), false); });
    });
  }
})();

// The course's GPU sessions (course.html, #course-sessions): book or cancel a reservation within the course's
// allowance, exempt the course from idle reclaim for a session or end that, through the REST API.
(function () {
  "use strict";
  var api = window.workbenchApi;
  var course = document.getElementById("course-title").dataset.course;
  var base = "api/courses/" + encodeURIComponent(course);
  var status = document.getElementById("course-status");
  function say(text, ok) {
    status.textContent = text;
    status.className = "alert " + (ok ? "alert-success" : "alert-danger");
  }
  function reloadSoon() { window.setTimeout(function () { window.location.reload(); }, 1500); }
  var reserve = document.getElementById("course-reserve-form");
  if (reserve) {
    reserve.addEventListener("submit", function (event) {
      event.preventDefault();
      var body = {gpus: parseInt(reserve.elements.gpus.value, 10), window: reserve.elements.window.value.trim()};
      api("POST", base + "/reservations", body).then(function (data) {
        say("Reserved #" + data.id + ": " + data.description + ".", true); reloadSoon();
      }).catch(function (e) { say("Not reserved: " + e.message, false); });
    });
  }
  document.querySelectorAll(".course-unreserve").forEach(function (button) {
    button.addEventListener("click", function () {
      var id = button.closest("li").dataset.reservation;
      if (!window.workbenchConfirm("Cancel reservation #" + id + "? Its GPUs go back to everyone.")) { return; }
      api("DELETE", base + "/reservations/" + encodeURIComponent(id)).then(function () {
        say("Cancelled reservation #" + id + ".", true); reloadSoon();
      }).catch(function (e) { say("Not cancelled: " + e.message, false); });
    });
  });
  var exempt = document.getElementById("course-exempt-form");
  if (exempt) {
    exempt.addEventListener("submit", function (event) {
      event.preventDefault();
      var body = {hours: parseFloat(exempt.elements.hours.value)};
      var reason = exempt.elements.reason.value.trim();
      if (reason) { body.reason = reason; }
      api("PUT", base + "/idle-exemption", body).then(function (data) {
        say("Exempt from idle reclaim until " + data.until.slice(0, 16).replace("T", " ") + " UTC.", true); reloadSoon();
      }).catch(function (e) { say("Not exempt: " + e.message, false); });
    });
  }
  var end = document.getElementById("course-unexempt");
  if (end) {
    end.addEventListener("click", function () {
      api("DELETE", base + "/idle-exemption").then(function () {
        say("Idle reclaim applies to the course again.", true); reloadSoon();
      }).catch(function (e) { say("Not changed: " + e.message, false); });
    });
  }
})();

// Every control above has its handler now: enable the buttons the page rendered disabled (course.html).
document.querySelectorAll("[data-needs-script]").forEach(function (button) { button.disabled = false; });
