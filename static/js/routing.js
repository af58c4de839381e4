/* The agent's routing page: reads the routing and the platform's backends from the
   management API with the page's session, and saves with PUT (CSRF header); the API's
   validation message is shown as it is. */
(function () {
  "use strict";
  var root = document.getElementById("routing");
  if (!root) return;
  var el = function (id) { return document.getElementById(id); };
  var headers = {"Accept": "application/json"};

  function list(text) {
    return text.split(",").map(function (s) { return s.trim(); }).filter(Boolean);
  }

  function show(routing) {
    el("rt-chain").value = routing.chain.join(", ");
    el("rt-policy").value = routing.policy;
    el("rt-cascade").value = routing.cascade.join(", ");
    el("rt-threshold").value = routing.cascade_threshold;
  }

  function cell(row, text) {
    var td = document.createElement("td");
    td.textContent = text;
    row.appendChild(td);
    return td;
  }

  function usd(microcents) { return "$" + (microcents / 100000000).toFixed(2); }

  function backends(rows) {
    var body = el("rt-backends").querySelector("tbody");
    body.innerHTML = "";
    rows.forEach(function (b) {
      var tr = document.createElement("tr");
      var th = document.createElement("th");
      th.scope = "row";
      th.textContent = b.name;
      tr.appendChild(th);
      cell(tr, b.kind);
      cell(tr, b.health).className = "health-" + b.health;
      cell(tr, b.probe_p95_ms ? Math.round(b.probe_p95_ms) + " ms" : "—");
      cell(tr, b.models.map(function (m) {
        return m.model + " (" + usd(m.price_input_per_mtok) + " / " + usd(m.price_output_per_mtok) + ")";
      }).join(", ") || "—");
      cell(tr, b.zone || "—");
      body.appendChild(tr);
    });
    if (!rows.length) cell(body.insertRow(), "Only the platform's own engines (local).").colSpan = 6;
  }

  function getJSON(url) {
    return fetch(url, {credentials: "same-origin", headers: headers}).then(function (r) {
      return r.json().then(function (d) {
        if (!r.ok) throw new Error(d.error ? d.error.message : "HTTP " + r.status);
        return d;
      });
    });
  }

  Promise.all([getJSON(root.dataset.routingUrl), getJSON(root.dataset.backendsUrl)])
    .then(function (results) {
      show(results[0]);
      backends(results[1]);
      el("rt-status").textContent = root.dataset.canEdit ? "" : "Read-only: changing routing needs the admin role.";
      if (!root.dataset.canEdit) {
        root.querySelectorAll("input, select").forEach(function (f) { f.disabled = true; });
      }
    })
    .catch(function (err) { el("rt-status").textContent = err.message; });

  el("routing-form").addEventListener("submit", function (event) {
    event.preventDefault();
    var body = {chain: list(el("rt-chain").value), policy: el("rt-policy").value,
                cascade: list(el("rt-cascade").value)};
    if (el("rt-threshold").value !== "") body.cascade_threshold = parseFloat(el("rt-threshold").value);
    el("rt-status").textContent = "Saving…";
    fetch(root.dataset.routingUrl, {
      method: "PUT", credentials: "same-origin", body: JSON.stringify(body),
      headers: {"Content-Type": "application/json", "Accept": "application/json",
                "X-CSRFToken": root.dataset.csrf}
    }).then(function (r) {
      return r.json().then(function (d) {
        if (!r.ok) throw new Error(d.error ? d.error.message : "HTTP " + r.status);
        show(d);
        el("rt-status").textContent = "Saved.";
      });
    }).catch(function (err) { el("rt-status").textContent = err.message; });
  });
})();
