// The fleet page (admin.html): live GPU readings, Drain/Undrain, and the quota editor. Text only (textContent),
// never HTML: names come from users.
(function () {
  "use strict";
  var api = window.workbenchApi;
  var ask = window.workbenchConfirm;

  function refresh() {
    api("GET", "api/gpus").then(function (data) {
      data.gpus.forEach(function (g) {
        var row = document.querySelector('tr[data-uuid="' + CSS.escape(g.uuid) + '"]');
        if (!row) { return; }
        var util = g.utilization_percent;
        row.querySelector(".wb-util").textContent = util === null ? "n/a" : Math.round(util) + " %";
        row.querySelector(".wb-util-bar").style.width = (util || 0) + "%";
        row.querySelector(".wb-util-source").textContent = g.reading_source === "dcgm" ? "DCGM" : "";
        row.querySelector(".wb-mem").textContent = g.memory_used_bytes === null ? "n/a" :
          (g.memory_used_bytes / 1073741824).toFixed(1) + " GiB";
        var idle = row.querySelector(".wb-idle");
        if (idle) {
          var unread = g.holders.length && (g.utilization_percent === null || g.utilization_percent === undefined);
          idle.textContent = g.idle_seconds !== null && g.idle_seconds !== undefined ?
            Math.floor(g.idle_seconds / 60) + " min " + Math.floor(g.idle_seconds % 60) + " s" :
            unread ? (g.mig ? "no reading (MIG slice" + (g.no_reading_reason ? ": " + g.no_reading_reason : "") +
              "): no idle rule" : "no reading: no idle rule") :
            (g.holders.length ? "busy" : "free");
        }
        row.querySelector(".wb-drain-state").textContent = g.unavailable ? "unavailable: " + g.unavailable :
          g.layout_waiting ? g.layout_waiting :
          (g.drained ? "draining: no new servers" : "");
        var drain = row.querySelector(".wb-drain-button");
        if (drain) {
          drain.dataset.drained = g.drained ? "true" : "false";
          drain.textContent = (g.drained ? "Undrain" : "Drain") + (g.mig ? " GPU" : "");
        }
        row.querySelector(".wb-holder").textContent = g.holders.length ?
          g.holders.map(holderName).join(", ") :
          (g.slurm && g.slurm.held_outside_workbench ? "a Slurm job outside the workbench" : "free");
      });
    }).catch(function () {});
  }
  setInterval(refresh, 2000);

  function holderName(h) { return h.user + (h.server ? "/" + h.server : ""); }

  // What a drain will do, in a sentence, from the fleet as it is now: "Drain GPU 2 (H100-80GB)? No new server
  // will get it. Its server (alice) will be stopped in 15 minutes, warned now; open notebooks are saved first."
  function drainSentence(label, gpu, minutes, gpus) {
    var holders = [];
    gpus.forEach(function (g) {
      if (g.uuid === gpu || g.parent_uuid === gpu) {
        g.holders.forEach(function (h) { if (holders.indexOf(holderName(h)) < 0) { holders.push(holderName(h)); } });
      }
    });
    var one = holders.length === 1, names = holders.join(", ");
    var sentence = "Drain " + label + "? No new server will get it.";
    if (!holders.length) { return sentence + " Nothing runs on it now."; }
    if (minutes) {
      return sentence + " " + (one ? "Its server (" + names + ") will be stopped" : "Its servers (" + names +
        ") will be stopped") + " in " + minutes + " minutes, warned now; open notebooks are saved first.";
    }
    return sentence + " " + (one ? "Its server (" + names + ") keeps running until it stops." :
      "Its servers (" + names + ") keep running until they stop.");
  }

  // Drain (after a confirmation) or undrain a GPU (a slice's row: its whole GPU), then show the page again.
  document.querySelectorAll(".wb-drain-button").forEach(function (button) {
    button.addEventListener("click", function () {
      var gpu = button.dataset.gpu, drained = button.dataset.drained === "true";
      var said = document.getElementById("drain-status");
      function tell(text, ok) {
        said.textContent = text;
        said.className = "mt-2 alert " + (ok === null ? "alert-secondary" : ok ? "alert-success" : "alert-danger");
      }
      var path = "api/drains/" + encodeURIComponent(gpu);
      var minutes = document.getElementById("drain-stop-minutes"), body = {};
      if (minutes && minutes.value.trim() !== "") { body.stop_servers_in_minutes = Number(minutes.value); }
      var done = function (d) {
        tell(drained ? "Undrained " + gpu + ": new servers may get it again." :
          "Drained " + gpu + ": no new server gets it; " + (d.holders.length ? (body.stop_servers_in_minutes ?
            "its servers were warned and will be stopped in " + body.stop_servers_in_minutes + " min." :
            "wait until its servers have stopped (Held by: free) before changing its layout.") : "nothing runs there."), true);
        setTimeout(function () { window.location.reload(); }, 800);
      };
      var failed = function (e) { tell((drained ? "Not undrained: " : "Not drained: ") + e.message, false); };
      if (drained) { api("DELETE", path).then(done).catch(failed); return; }
      api("GET", "api/gpus").then(function (data) {
        if (!ask(drainSentence(button.dataset.label, gpu, body.stop_servers_in_minutes, data.gpus))) {
          tell("Not drained: nothing was changed.", null);
          return;
        }
        return api("PUT", path, body).then(done);
      }).catch(failed);
    });
  });

  var form = document.getElementById("quota-form");
  if (!form) { return; }
  var status = document.getElementById("quota-status");
  function say(text, ok) {
    status.textContent = text;
    status.className = "mt-2 alert " + (ok === null ? "alert-secondary" : ok ? "alert-success" : "alert-danger");
  }
  function value(id) { return document.getElementById(id).value.trim(); }
  function target() {
    var kind = value("quota-kind"), name = value("quota-name");
    return {kind: kind, name: name, path: "api/quotas/" + kind + "s/" + encodeURIComponent(name)};
  }
  function numberOrNull(text) { return text === "" ? null : Number(text); }
  document.querySelectorAll(".wb-edit").forEach(function (button) {
    button.addEventListener("click", function () {
      var q = JSON.parse(button.dataset.quota);
      document.getElementById("quota-kind").value = button.dataset.kind;
      document.getElementById("quota-name").value = button.dataset.name;
      document.getElementById("quota-max-gpus").value = q.max_gpus;
      document.getElementById("quota-hours").value = q.gpu_hours_per_week === null ? "" : q.gpu_hours_per_week;
      document.getElementById("quota-models").value = q.allowed_models === null ? "" : q.allowed_models.join(", ");
      document.getElementById("quota-whole-gpus").checked = q.whole_gpus !== false;
      document.getElementById("quota-shared-gpus").checked = q.shared_gpus !== false;
      document.getElementById("quota-profiles").value = q.allowed_profiles == null ? "" :
        (q.allowed_profiles.length ? q.allowed_profiles.join(", ") : "none");
      document.getElementById("quota-session").value = q.max_session_hours === null ? "" : q.max_session_hours;
      document.getElementById("quota-idle").value = q.gpu_idle_minutes == null ? "" : q.gpu_idle_minutes;
      document.getElementById("quota-idle-threshold").value = q.gpu_idle_threshold == null ? "" : q.gpu_idle_threshold;
      document.getElementById("quota-max-gpus").focus();
    });
  });
  form.addEventListener("submit", function (event) {
    event.preventDefault();
    var t = target();
    if (!t.name) { say("Enter a user or group name.", false); return; }
    var models = value("quota-models");
    var profiles = value("quota-profiles");
    var body = {
      max_gpus: value("quota-max-gpus") === "" ? null : Number(value("quota-max-gpus")),
      gpu_hours_per_week: numberOrNull(value("quota-hours")),
      allowed_models: models === "" ? null : models.split(",").map(function (m) { return m.trim(); }).filter(Boolean),
      max_session_hours: numberOrNull(value("quota-session")),
      gpu_idle_minutes: numberOrNull(value("quota-idle")),
      gpu_idle_threshold: numberOrNull(value("quota-idle-threshold")),
      whole_gpus: document.getElementById("quota-whole-gpus").checked,
      allowed_profiles: profiles === "" ? null : profiles.toLowerCase() === "none" ? [] :
        profiles.split(",").map(function (p) { return p.trim(); }).filter(Boolean),
      shared_gpus: document.getElementById("quota-shared-gpus").checked
    };
    api("PUT", t.path, body).then(function () {
      say("Saved the quota of " + t.kind + " " + t.name + ". It applies to the next spawn.", true);
      setTimeout(function () { window.location.reload(); }, 800);
    }).catch(function (e) { say("Not saved: " + e.message, false); });
  });
  document.getElementById("quota-delete").addEventListener("click", function () {
    var t = target();
    if (!t.name) { say("Enter a user or group name.", false); return; }
    var then = t.kind === "user" ? "From the next spawn they get their groups' quota or the hub's default" :
      "From the next spawn its members get their own quota, another group's or the hub's default";
    if (!ask("Delete the quota of " + t.kind + " " + t.name + "? " + then + "; running servers keep what they have.")) {
      say("Not deleted: nothing was changed.", null);
      return;
    }
    api("DELETE", t.path).then(function () {
      say("Deleted the quota of " + t.kind + " " + t.name + ".", true);
      setTimeout(function () { window.location.reload(); }, 800);
    }).catch(function (e) { say("Not deleted: " + e.message, false); });
  });
})();
