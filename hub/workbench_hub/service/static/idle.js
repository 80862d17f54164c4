// Idle reclaim on the fleet page (idle_section.html): the hub's rule and the exempt groups, from api/idle;
// admins exempt a group, or end an exemption after a confirmation. Text only, never HTML.
(function () {
  "use strict";
  var admin = window.workbenchAdmin;
  var api = window.workbenchApi;
  var status = document.getElementById("idle-status");
  function say(text, ok) {
    status.textContent = text;
    status.className = "mt-2 alert " + (ok === null ? "alert-secondary" : ok ? "alert-success" : "alert-danger");
  }
  function cell(row, text) { var td = document.createElement("td"); td.textContent = text; row.appendChild(td); return td; }
  function endExemption(group) {
    if (!window.workbenchConfirm("End the idle exemption of group " + group + "? From the next check, its members' " +
        "servers whose GPUs stay idle are warned and stopped again.")) {
      say("Not changed: group " + group + " stays exempt.", null);
      return;
    }
    api("DELETE", "api/idle/exemptions/" + encodeURIComponent(group)).then(function () {
      say("Group " + group + " is subject to idle reclaim again.", true); load();
    }).catch(function (e) { say("Not changed: " + e.message, false); });
  }
  function load() {
    api("GET", "api/idle").then(function (data) {
      var r = data.default_rule;
      document.getElementById("idle-rule").textContent = r.enabled ?
        "Hub default: a server whose GPUs all stay under " + r.gpu_idle_threshold + " % for " + r.gpu_idle_minutes +
        " min is stopped (warned " + Math.round(r.warn_minutes_before * 10) / 10 + " min before). Quotas may set their own." :
        "Hub default: idle reclaim is off (WORKBENCH_GPU_IDLE_MINUTES=0); quotas that set gpu_idle_minutes still apply.";
      var body = document.querySelector("#idle-exempt-table tbody");
      body.textContent = "";
      data.exempt_groups.forEach(function (g) {
        var row = document.createElement("tr");
        row.dataset.group = g.group;
        cell(row, g.group); cell(row, g.reason); cell(row, g.created.slice(0, 16).replace("T", " ") + " UTC");
        cell(row, g.created_by);
        if (admin) {
          var button = document.createElement("button");
          button.className = "btn btn-sm btn-outline-danger idle-unexempt";
          button.textContent = "End exemption";
          button.addEventListener("click", function () { endExemption(g.group); });
          cell(row, "").appendChild(button);
        }
        body.appendChild(row);
      });
      if (!data.exempt_groups.length) {
        var row = document.createElement("tr");
        var td = cell(row, "No group is exempt.");
        td.colSpan = admin ? 5 : 4; td.className = "text-muted";
        body.appendChild(row);
      }
    }).catch(function (e) { document.getElementById("idle-rule").textContent = "Idle rule unavailable: " + e.message; });
  }
  var form = document.getElementById("idle-exempt-form");
  if (form) {
    form.addEventListener("submit", function (event) {
      event.preventDefault();
      var group = document.getElementById("idle-exempt-group").value.trim();
      var reason = document.getElementById("idle-exempt-reason").value.trim();
      if (!group) { say("Enter a group name.", false); return; }
      api("PUT", "api/idle/exemptions/" + encodeURIComponent(group), {reason: reason}).then(function () {
        say("Group " + group + " is exempt from idle reclaim from the next check.", true); load();
      }).catch(function (e) { say("Not exempted: " + e.message, false); });
    });
  }
  load();
})();
