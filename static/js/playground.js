/* The playground: asks the portal for a short-lived inference key (kept in this closure
   only, never stored or rendered), lists the agent's models from /v1/models, and chats over
   the /ws/v1/chat websocket; each answer shows its tokens, latency and its cost read from
   the ledger; Cancel stops the answer being generated. */
(function () {
  "use strict";
  var root = document.getElementById("playground");
  if (!root) return;
  var el = function (id) { return document.getElementById(id); };
  var state = {agent: null, key: null, socket: null, ready: null, history: [], current: null,
               seq: 0};

  function status(text) { el("pg-status").textContent = text; }
  function busy(on) {
    el("pg-send").disabled = on || !state.key || !el("pg-model").value;
    el("pg-cancel").disabled = !on;
  }

  function mintKey(agentId) {
    return fetch(root.dataset.keyUrl, {
      method: "POST", credentials: "same-origin", body: new URLSearchParams({agent: agentId}),
      headers: {"X-CSRFToken": root.dataset.csrf}
    }).then(function (r) {
      return r.json().then(function (data) {
        if (!r.ok) throw new Error(data.error ? data.error.message : "HTTP " + r.status);
        return data.key;
      });
    });
  }

  // Max tokens cannot ask for more than the chosen model's context (less one prompt token).
  function fitMaxTokens() {
    var option = el("pg-model").selectedOptions[0], input = el("pg-max-tokens");
    var context = option && parseInt(option.dataset.context, 10);
    input.max = context > 1 ? context - 1 : 32768;
    if (parseInt(input.value, 10) > parseInt(input.max, 10)) input.value = input.max;
  }

  function loadModels() {
    return fetch("/v1/models", {headers: {Authorization: "Bearer " + state.key}})
      .then(function (r) { return r.json().then(function (d) { return [r, d]; }); })
      .then(function (pair) {
        if (!pair[0].ok) throw new Error(pair[1].error.message);
        var select = el("pg-model");
        var chosen = select.value;
        select.innerHTML = "";
        pair[1].data.forEach(function (m) {
          var option = document.createElement("option");
          option.value = option.textContent = m.id;
          if (m.max_model_len) option.dataset.context = m.max_model_len;
          select.appendChild(option);
        });
        if (chosen) select.value = chosen;
        if (!select.value && select.options.length) select.selectedIndex = 0;
        select.disabled = !pair[1].data.length;
        fitMaxTokens();
        if (!pair[1].data.length) status("No model this agent may use is served right now.");
      });
  }

  function disconnect() {
    if (state.socket) state.socket.close();
    state.socket = null;
    state.ready = null;
  }

  function connect() {
    if (state.ready) return state.ready;
    state.ready = new Promise(function (resolve, reject) {
      var scheme = window.location.protocol === "https:" ? "wss://" : "ws://";
      var socket = new WebSocket(scheme + window.location.host + "/ws/v1/chat");
      state.socket = socket;
      socket.onopen = function () {
        socket.send(JSON.stringify({type: "auth", api_key: state.key}));
      };
      socket.onmessage = function (event) {
        var frame = JSON.parse(event.data);
        if (frame.type === "auth.ok") resolve(socket);
        else if (frame.type === "error" && frame.id === null) reject(new Error(frame.error.message));
        else handle(frame);
      };
      socket.onclose = function () {
        if (state.socket === socket) { state.socket = null; state.ready = null; }
        if (state.current) finish(state.current, {error: {message: "The connection closed."}});
        reject(new Error("The connection closed."));
      };
    });
    return state.ready;
  }

  function setAgent() {
    if (state.agent === el("pg-agent").value) return;
    state.agent = el("pg-agent").value;
    disconnect();
    state.key = null;
    state.history = [];
    busy(false);
    status("Getting a key for this page…");
    mintKey(el("pg-agent").value)
      .then(function (key) { state.key = key; return loadModels(); })
      .then(function () { status("Ready."); busy(false); })
      .catch(function (err) { status(err.message); });
  }

  function item(role, text) {
    var li = document.createElement("li");
    li.className = "msg " + role;
    var who = document.createElement("strong");
    who.textContent = role === "user" ? "You" : "Model";
    var body = document.createElement("div");
    body.className = "text";
    body.textContent = text;
    li.appendChild(who);
    li.appendChild(body);
    el("pg-transcript").appendChild(li);
    return li;
  }

  function handle(frame) {
    var run = state.current;
    if (!run || frame.id !== run.id) return;
    if (frame.type === "chunk") {
      var data = frame.data;
      run.requestId = run.requestId || String(data.id || "").replace(/^chatcmpl-/, "");
      var delta = data.choices && data.choices[0] && data.choices[0].delta;
      if (delta && delta.content) {
        if (!run.firstToken) run.firstToken = performance.now();
        run.text += delta.content;
        run.body.textContent = run.text;
      }
    } else if (frame.type === "done" || frame.type === "error") {
      finish(run, frame);
    }
  }

  function finish(run, frame) {
    state.current = null;
    busy(false);
    var ms = Math.round(performance.now() - run.started);
    var stats = document.createElement("p");
    stats.className = "stats";
    var parts = [];
    if (frame.error) {
      run.li.classList.add("failed");
      parts.push("Error: " + frame.error.message);
    } else if (frame.cancelled) {
      parts.push("Cancelled");
    }
    if (frame.usage) {
      parts.push(frame.usage.prompt_tokens + " prompt + " + frame.usage.completion_tokens +
                 " completion tokens");
      state.history.push({role: "assistant", content: run.text});
    }
    parts.push("latency " + ms + " ms" + (run.firstToken ?
      " (first token " + Math.round(run.firstToken - run.started) + " ms)" : ""));
    stats.textContent = parts.join(" · ");
    var cost = document.createElement("span");
    cost.className = "cost";
    stats.appendChild(cost);
    run.li.appendChild(stats);
    status(frame.error ? "Failed." : frame.cancelled ? "Cancelled." : "Done.");
    if (run.requestId) ledger(run.requestId, cost, 0);
  }

  function ledger(requestId, target, attempt) {
    var url = root.dataset.ledgerUrl.replace("REQUEST_ID", encodeURIComponent(requestId));
    fetch(url, {credentials: "same-origin"}).then(function (r) {
      if (r.status === 404 && attempt < 20) {
        setTimeout(function () { ledger(requestId, target, attempt + 1); }, 250);
        return null;
      }
      return r.ok ? r.json() : null;
    }).then(function (row) {
      if (row) {
        target.textContent = " · cost $" + row.cost_usd + " (ledger: " + row.status + ", " +
          row.completion_tokens + " completion tokens)";
        target.dataset.cost = row.cost_microcents;
        target.dataset.request = row.request_id;
      }
    });
  }

  function send(event) {
    event.preventDefault();
    var prompt = el("pg-prompt").value.trim();
    if (!prompt || state.current) return;
    var messages = [];
    var system = el("pg-system").value.trim();
    if (system) messages.push({role: "system", content: system});
    state.history.push({role: "user", content: prompt});
    messages = messages.concat(state.history);
    item("user", prompt);
    var li = item("assistant", "");
    var run = {id: "pg-" + (++state.seq), li: li, body: li.querySelector(".text"), text: "",
               started: performance.now(), firstToken: null, requestId: null};
    state.current = run;
    el("pg-prompt").value = "";
    busy(true);
    status("Generating…");
    var body = {model: el("pg-model").value, messages: messages,
                max_tokens: parseInt(el("pg-max-tokens").value, 10) || 128,
                temperature: parseFloat(el("pg-temperature").value),
                top_p: parseFloat(el("pg-top-p").value)};
    connect().then(function (socket) {
      socket.send(JSON.stringify({type: "chat.completions", id: run.id, body: body}));
    }).catch(function (err) { if (state.current === run) finish(run, {error: {message: err.message}}); });
  }

  function cancel() {
    var run = state.current;
    if (run && state.socket) {
      state.socket.send(JSON.stringify({type: "cancel", id: run.id}));
      status("Cancelling…");
    }
  }

  el("playground-form").addEventListener("submit", send);
  el("pg-cancel").addEventListener("click", cancel);
  el("pg-clear").addEventListener("click", function () {
    state.history = [];
    el("pg-transcript").innerHTML = "";
  });
  el("pg-agent").addEventListener("change", setAgent);
  el("pg-model").addEventListener("change", function () { fitMaxTokens(); busy(!!state.current); });
  setAgent();
})();
