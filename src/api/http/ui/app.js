// The Agentry directory page. Plain script, no framework, no build step.
//
// Two rules hold throughout:
// - Record data (written by untrusted publishers) reaches the DOM only as
//   text: through el()/text() below, which use createElement and
//   textContent. Nothing here parses a string as HTML.
// - The caller's token lives in this tab's sessionStorage and travels only
//   as an Authorization header on same-origin API calls; it never enters a
//   URL, so it cannot leak through history, logs or a Referer.
"use strict";

(function () {
  var TOKEN_KEY = "agentry.token";
  var state = { token: "", admin: false, registry: null };

  try {
    state.token = window.sessionStorage.getItem(TOKEN_KEY) || "";
  } catch (e) {
    state.token = "";
  }

  // ---- DOM helpers -------------------------------------------------------

  function $(id) {
    return document.getElementById(id);
  }

  // el("div", {class: "x", href: "#/..."}, child, "text", [children])
  function el(tag, attrs) {
    var node = document.createElement(tag);
    if (attrs) {
      Object.keys(attrs).forEach(function (k) {
        var v = attrs[k];
        if (v === undefined || v === null || v === false) return;
        if (k === "class") node.className = v;
        else if (k === "text") node.textContent = String(v);
        else node.setAttribute(k, v === true ? "" : String(v));
      });
    }
    for (var i = 2; i < arguments.length; i++) append(node, arguments[i]);
    return node;
  }

  function append(node, child) {
    if (child === undefined || child === null || child === false) return;
    if (Array.isArray(child)) {
      child.forEach(function (c) {
        append(node, c);
      });
    } else if (child instanceof Node) {
      node.appendChild(child);
    } else {
      node.appendChild(document.createTextNode(String(child)));
    }
  }

  function clear(node) {
    while (node.firstChild) node.removeChild(node.firstChild);
    return node;
  }

  function fmt(n, digits) {
    return typeof n === "number" ? n.toFixed(digits === undefined ? 3 : digits) : "–";
  }

  // A link to an agent's page; the id is encoded into the fragment only.
  function agentHref(id) {
    return "#/agent/" + encodeURIComponent(id);
  }

  // A definition list from [label, value] pairs; empty values are left out.
  function facts(pairs, cls) {
    var dl = el("dl", { class: "facts" + (cls ? " " + cls : "") });
    pairs.forEach(function (p) {
      if (p[1] === undefined || p[1] === null || p[1] === "") return;
      dl.appendChild(el("dt", null, p[0]));
      dl.appendChild(el("dd", p[2] ? { class: p[2] } : null, p[1]));
    });
    return dl;
  }

  function badge(textValue, kind) {
    return el("span", { class: "badge " + (kind || "") }, textValue);
  }

  // ---- API ---------------------------------------------------------------

  // Calls the JSON API at this page's origin with the caller's token.
  // Resolves to {status, body}; never throws for an HTTP error status.
  function api(method, path, body) {
    var headers = { Accept: "application/json" };
    if (state.token) headers.Authorization = "Bearer " + state.token;
    var init = { method: method, headers: headers, credentials: "omit", cache: "no-store" };
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    return fetch(path, init).then(function (resp) {
      return resp.text().then(function (t) {
        var parsed = null;
        try {
          parsed = t ? JSON.parse(t) : null;
        } catch (e) {
          parsed = null;
        }
        return { status: resp.status, body: parsed };
      });
    });
  }

  function problemText(r) {
    var b = r.body || {};
    return "Error " + r.status + (b.code ? " (" + b.code + ")" : "") + ": " + (b.message || b.detail || "request failed");
  }

  // ---- credentials ---------------------------------------------------------

  // An admin credential is one the audit trail accepts (it needs admin);
  // only then does the page show the cluster view.
  function probeAdmin() {
    if (!state.token) {
      state.admin = false;
      return Promise.resolve(false);
    }
    return api("GET", "audit?page_size=1").then(
      function (r) {
        state.admin = r.status === 200;
        return state.admin;
      },
      function () {
        state.admin = false;
        return false;
      }
    );
  }

  function showIdentity() {
    $("whoami").textContent = state.token ? (state.admin ? "token set · admin" : "token set") : "anonymous";
    $("nav-cluster").hidden = !state.admin;
  }

  function useToken(value) {
    state.token = (value || "").trim();
    try {
      if (state.token) window.sessionStorage.setItem(TOKEN_KEY, state.token);
      else window.sessionStorage.removeItem(TOKEN_KEY);
    } catch (e) {
      // Storage refused (private mode): the token stays in memory only.
    }
    $("token").value = "";
    $("token").placeholder = state.token ? "token in use (hidden)" : "API key or JWT (optional)";
    return probeAdmin().then(function () {
      showIdentity();
      route();
    });
  }

  // ---- search --------------------------------------------------------------

  function list(value) {
    return value
      .split(",")
      .map(function (s) {
        return s.trim();
      })
      .filter(function (s) {
        return s.length > 0;
      });
  }

  function search(ev) {
    if (ev) ev.preventDefault();
    var query = $("q").value.trim();
    if (!query) return;
    state.lastQuery = query;
    var req = { query: query, limit: 10, include_evidence: true, detail: "summary" };
    var tags = list($("tags").value);
    var protocols = list($("protocols").value);
    if (tags.length) req.required_tags = tags;
    if (protocols.length) req.protocols = protocols;
    if ($("verified").checked) req.constraints = { verified_only: true };
    if ($("scope").value === "federated") req.scope = "federated";
    var status = $("search-status");
    var results = clear($("results"));
    status.textContent = "Searching…";
    results.setAttribute("aria-busy", "true");
    api("POST", "discover", req).then(
      function (r) {
        results.removeAttribute("aria-busy");
        if (r.status !== 200) {
          status.textContent = problemText(r);
          return;
        }
        var cands = (r.body && r.body.candidates) || [];
        var note = cands.length + " result" + (cands.length === 1 ? "" : "s");
        var unsupported = (r.body && r.body.unsupported_filters) || [];
        if (unsupported.length) note += " · filters not applied: " + unsupported.join(", ");
        if (r.body && r.body.partial) note += " · partial (some peers did not answer)";
        status.textContent = note;
        cands.forEach(function (c, i) {
          results.appendChild(renderCandidate(c, i + 1));
        });
      },
      function (e) {
        results.removeAttribute("aria-busy");
        status.textContent = "The registry could not be reached: " + e;
      }
    );
  }

  var COMPONENTS = ["context", "example", "lexical", "tag", "protocol", "freshness", "policy"];

  function renderComponents(sc) {
    var table = el("table", { class: "components" }, el("caption", null, "Score components"));
    var names = COMPONENTS.filter(function (k) {
      return k in sc;
    }).concat(
      Object.keys(sc).filter(function (k) {
        return COMPONENTS.indexOf(k) < 0;
      })
    );
    names.forEach(function (k) {
      var v = sc[k];
      var bar = el("span", { class: "bar" });
      if (typeof v === "number") bar.style.width = Math.max(0, Math.min(1, v)) * 100 + "%";
      table.appendChild(
        el("tr", { "data-component": k }, el("th", null, k), el("td", { class: "num" }, fmt(v)), el("td", { class: "meter" }, bar))
      );
    });
    return table;
  }

  function renderCandidate(c, rank) {
    var li = el("li", { class: "result", "data-id": c.id });
    var verification = c.verification || "unknown";
    li.appendChild(
      el(
        "div",
        { class: "result-head" },
        el("span", { class: "rank" }, String(rank)),
        el("a", { class: "name", href: agentHref(c.id) }, c.name || c.id),
        el("code", { class: "id" }, c.id),
        badge(verification.replace(/_/g, " "), verification === "verified" ? "ok" : "warn"),
        c.status && c.status !== "active" ? badge(c.status, "warn") : null,
        c.origin_authority ? badge("from " + c.origin_authority, "fed") : null,
        el("span", { class: "score" }, "score " + fmt(c.score, 4))
      )
    );
    if (c.snippet || c.description) li.appendChild(el("p", { class: "snippet" }, c.snippet || c.description));
    var evidence = el("div", { class: "evidence" });
    if (c.score_components) evidence.appendChild(renderComponents(c.score_components));
    var examples = c.matched_examples || [];
    var ex = el("div", { class: "matched" }, el("h4", null, "Matched examples"));
    if (examples.length) {
      var ul = el("ul", { class: "examples" });
      examples.forEach(function (m) {
        ul.appendChild(
          el("li", { class: "example" }, el("q", null, m.text), " ", el("span", { class: "muted" }, (m.kind || "example") + " " + fmt(m.score)))
        );
      });
      ex.appendChild(ul);
    } else {
      ex.appendChild(el("p", { class: "muted" }, "none"));
    }
    var tags = (c.matched_tags || []).concat(c.tag_matches || []);
    if (tags.length) {
      ex.appendChild(el("p", { class: "tags" }, "Matched tags: ", tags.map(function (t) {
        return badge(typeof t === "string" ? t : JSON.stringify(t));
      })));
    }
    evidence.appendChild(ex);
    li.appendChild(evidence);
    return li;
  }

  // ---- agent page -----------------------------------------------------------

  // A JSON Schema as nested lists: property names, types, required marks,
  // enums and descriptions. Unknown keywords are left to the raw view.
  function renderSchema(schema, depth) {
    depth = depth || 0;
    if (schema === undefined || schema === null) return el("p", { class: "muted" }, "not declared");
    if (typeof schema !== "object" || depth > 8) return el("code", null, JSON.stringify(schema));
    var box = el("div", { class: "schema" });
    var line = el("div", { class: "schema-line" });
    var type = Array.isArray(schema.type) ? schema.type.join(" | ") : schema.type;
    if (type === "array" && schema.items && typeof schema.items === "object") {
      line.appendChild(el("span", { class: "type" }, "array of " + (schema.items.type || "items")));
    } else if (type) {
      line.appendChild(el("span", { class: "type" }, type));
    }
    if (schema.format) line.appendChild(el("span", { class: "muted" }, " (" + schema.format + ")"));
    if (Array.isArray(schema.enum)) {
      line.appendChild(
        el("span", { class: "enum" }, " one of: ", schema.enum.map(function (v, i) {
          return [i ? ", " : "", el("code", null, JSON.stringify(v))];
        }))
      );
    }
    if (schema.description) line.appendChild(el("span", { class: "desc" }, " — " + schema.description));
    if (line.firstChild) box.appendChild(line);
    var props = schema.properties;
    if (type === "array" && schema.items && schema.items.properties) props = schema.items.properties;
    if (props && typeof props === "object") {
      var required = (type === "array" && schema.items ? schema.items.required : schema.required) || [];
      var ul = el("ul", { class: "props" });
      Object.keys(props).forEach(function (name) {
        ul.appendChild(
          el(
            "li",
            null,
            el("code", { class: "prop" }, name),
            required.indexOf(name) >= 0 ? badge("required", "req") : null,
            renderSchema(props[name], depth + 1)
          )
        );
      });
      box.appendChild(ul);
    }
    return box;
  }

  function raw(label, value) {
    return el("details", { class: "raw" }, el("summary", null, label), el("pre", null, JSON.stringify(value, null, 2)));
  }

  function keyState(keyId) {
    var reg = state.registry;
    if (!reg || !Array.isArray(reg.keys)) return null;
    for (var i = 0; i < reg.keys.length; i++) {
      if (reg.keys[i].key_id === keyId) return reg.keys[i].state || "listed";
    }
    return null;
  }

  function renderAgent(id) {
    var view = clear($("view-agent"));
    view.appendChild(el("p", { class: "muted" }, "Loading ", el("code", null, id), "…"));
    api("GET", "agents/" + encodeURIComponent(id)).then(
      function (r) {
        clear(view);
        if (r.status !== 200) {
          view.appendChild(el("p", { class: "error" }, problemText(r)));
          return;
        }
        drawAgent(view, r.body || {});
      },
      function (e) {
        clear(view);
        view.appendChild(el("p", { class: "error" }, "The registry could not be reached: " + e));
      }
    );
  }

  function drawAgent(view, a) {
    var reg = a.registry || {};
    var status = a.status || "active";
    var head = el(
      "div",
      { class: "agent-head" },
      el("h2", { id: "agent-name" }, a.name || a.id),
      el("code", { id: "agent-id" }, a.id),
      a.version ? el("span", { class: "muted" }, " v" + a.version) : null,
      badge(status, status === "active" ? "ok" : "warn")
    );
    view.appendChild(el("p", null, el("a", { href: "#/" }, "← back to search")));
    view.appendChild(head);
    view.appendChild(el("p", { id: "agent-description", class: "description" }, a.description || ""));
    if ((a.tags || []).length || (a.capabilities || []).length) {
      view.appendChild(
        el(
          "p",
          { class: "tags" },
          (a.tags || []).map(function (t) {
            return badge(t);
          }),
          (a.capabilities || []).map(function (t) {
            return badge(t, "cap");
          })
        )
      );
    }

    // Lifecycle.
    var life = el("section", { id: "agent-lifecycle", class: "card" }, el("h3", null, "Lifecycle"));
    life.appendChild(
      facts([
        ["Status", status, "status"],
        ["Reason", reg.status_reason],
        ["Deleted", reg.deleted ? "yes" : "no"],
        ["Expired", reg.expired ? "yes" : "no"],
        ["Visibility", reg.visibility],
        ["Owner", reg.owner],
        ["Publisher", a.publisher],
        ["Registered", reg.registered_at],
        ["Modified", reg.modified_at],
        ["Revision", reg.revision]
      ])
    );
    view.appendChild(life);

    // Signature and publisher verification.
    var trust = el("section", { id: "agent-signature", class: "card" }, el("h3", null, "Signature and verification"));
    var sig = reg.signature;
    var pub = reg.publisher || {};
    var pairs = [];
    if (sig) {
      var ks = keyState(sig.key_id);
      var known = ks ? "this registry's key, " + ks : sig.authority && state.registry && sig.authority !== state.registry.authority ? "a peer registry's key" : "key not listed by this registry";
      pairs = [
        ["Signed by", sig.authority],
        ["Algorithm", sig.alg],
        ["Key", sig.key_id],
        ["Key state", known, "key-state"],
        ["Signed at", sig.signed_at],
        ["Signature", sig.value ? sig.value.slice(0, 24) + "…" : ""]
      ];
    } else {
      trust.appendChild(el("p", { class: "warn" }, "This record carries no registry signature."));
    }
    trust.appendChild(
      facts(
        pairs.concat([
          ["Publisher", (pub.state || "unknown").replace(/_/g, " "), "publisher-state"],
          ["Publisher key", pub.key_id],
          ["Why", pub.reason]
        ])
      )
    );
    view.appendChild(trust);

    // Federation provenance.
    var prov = el("section", { id: "agent-provenance", class: "card" }, el("h3", null, "Provenance"));
    if (reg.provenance) {
      var p = reg.provenance;
      prov.appendChild(
        facts([
          ["Origin registry", p.origin_authority],
          ["Origin service", p.origin_service],
          ["Origin revision", p.origin_revision],
          ["Origin key", p.origin_signature ? p.origin_signature.key_id : ""],
          ["Received", p.received_at]
        ])
      );
    } else {
      prov.appendChild(el("p", null, "Published to this registry" + (state.registry ? " (" + state.registry.authority + ")" : "") + "; not copied from a peer."));
    }
    view.appendChild(prov);

    // Bindings.
    var bind = el("section", { id: "agent-bindings", class: "card" }, el("h3", null, "Bindings"));
    var bindings = a.bindings || [];
    if (a.endpoint && !bindings.length) bindings = [{ protocol: "endpoint", endpoint: a.endpoint }];
    if (bindings.length) {
      var t = el("table", { class: "bindings" }, el("tr", null, el("th", null, "Protocol"), el("th", null, "Endpoint"), el("th", null, "Details")));
      bindings.forEach(function (b) {
        var rest = {};
        Object.keys(b).forEach(function (k) {
          if (k !== "protocol" && k !== "endpoint") rest[k] = b[k];
        });
        t.appendChild(
          el(
            "tr",
            { class: "binding" },
            el("td", null, el("code", null, b.protocol || "")),
            el("td", null, el("code", null, b.endpoint || b.url || "")),
            el("td", null, Object.keys(rest).length ? el("code", null, JSON.stringify(rest)) : "")
          )
        );
      });
      bind.appendChild(t);
    } else {
      bind.appendChild(el("p", { class: "muted" }, "none declared"));
    }
    if (a.authentication) bind.appendChild(facts([["Authentication", a.authentication.type], ["Instructions", a.authentication.instructions]]));
    view.appendChild(bind);

    // Operations with their schemas.
    var ops = el("section", { id: "agent-operations", class: "card" }, el("h3", null, "Operations"));
    var operations = a.operations || [];
    if (!operations.length) ops.appendChild(el("p", { class: "muted" }, "none declared"));
    operations.forEach(function (op) {
      var o = el("article", { class: "operation" }, el("h4", null, el("code", null, op.name || "(unnamed)")));
      if (op.description) o.appendChild(el("p", null, op.description));
      o.appendChild(el("div", { class: "io" }, el("div", { class: "inputs" }, el("h5", null, "Input"), renderSchema(op.inputs || op.input_schema)), el("div", { class: "outputs" }, el("h5", null, "Output"), renderSchema(op.outputs || op.output_schema))));
      (op.examples || []).forEach(function (x) {
        o.appendChild(raw("Example", x));
      });
      ops.appendChild(o);
    });
    view.appendChild(ops);

    // Examples of requests the agent serves.
    if ((a.examples || []).length) {
      var exs = el("section", { id: "agent-examples", class: "card" }, el("h3", null, "Example requests"));
      exs.appendChild(
        el(
          "ul",
          { class: "examples" },
          a.examples.map(function (x) {
            return el("li", null, el("q", null, typeof x === "string" ? x : x.text || JSON.stringify(x)));
          })
        )
      );
      view.appendChild(exs);
    }
    view.appendChild(raw("Signed record (JSON)", a));
  }

  // ---- registry identity --------------------------------------------------

  function loadRegistry() {
    return api("GET", ".well-known/agentry.json").then(
      function (r) {
        if (r.status === 200 && r.body) {
          state.registry = r.body;
          $("authority").textContent = r.body.authority || "";
        }
        return r;
      },
      function (e) {
        return { status: 0, body: { message: String(e) } };
      }
    );
  }

  function renderRegistry() {
    var view = clear($("view-registry"));
    loadRegistry().then(function (r) {
      if (r.status !== 200) {
        view.appendChild(el("p", { class: "error" }, problemText(r)));
        return;
      }
      var reg = r.body;
      view.appendChild(el("h2", null, "Registry ", el("code", { id: "registry-authority" }, reg.authority)));
      view.appendChild(
        facts([
          ["Signing key", reg.signing_key],
          ["Federation endpoint", reg.federation_endpoint],
          ["ADP level", reg.adp_level],
          ["Established", reg.established ? "yes" : "no"]
        ])
      );
      var t = el(
        "table",
        { id: "registry-keys", class: "keys" },
        el("caption", null, "Signing keys"),
        el("tr", null, ["Key id", "Algorithm", "State", "Valid from", "Until", "Public key"].map(function (h) {
          return el("th", null, h);
        }))
      );
      (reg.keys || []).forEach(function (k) {
        t.appendChild(
          el(
            "tr",
            { class: "key" },
            el("td", null, el("code", null, k.key_id)),
            el("td", null, k.alg),
            el("td", null, badge(k.state || "", k.state === "valid" ? "ok" : "warn")),
            el("td", null, k.not_before || ""),
            el("td", null, k.not_after || k.retired_at || k.revoked_at || ""),
            el("td", null, el("code", { class: "wrap" }, k.public_key || ""))
          )
        );
      });
      view.appendChild(t);
      view.appendChild(raw("Identity document (JSON)", reg));
    });
  }

  // ---- cluster (admin) -----------------------------------------------------

  function renderCluster() {
    var view = clear($("view-cluster"));
    if (!state.admin) {
      view.appendChild(el("p", { id: "cluster-denied", class: "muted" }, "The cluster status is shown to administrators: enter an admin token above."));
      return;
    }
    api("GET", "cluster").then(function (r) {
      if (r.status !== 200) {
        view.appendChild(el("p", { class: "error" }, problemText(r)));
        return;
      }
      var c = r.body || {};
      var n = c.node || {};
      view.appendChild(el("h2", null, "Cluster"));
      view.appendChild(
        facts(
          [
            ["This node", n.id],
            ["Role", n.role, "node-role"],
            ["Leader", c.leader_id],
            ["Term", n.term],
            ["Commit index", n.commit_index],
            ["Applied index", n.applied_index],
            ["Snapshot index", n.snapshot_index],
            ["Cluster id", n.cluster_id]
          ],
          "cluster-node"
        )
      );
      var t = el(
        "table",
        { id: "cluster-members", class: "members" },
        el("caption", null, "Members"),
        el("tr", null, ["Id", "Raft address", "Role", "Leader", "Matched index", "Lag"].map(function (h) {
          return el("th", null, h);
        }))
      );
      (c.members || []).forEach(function (m) {
        t.appendChild(
          el(
            "tr",
            { class: "member" },
            el("td", null, String(m.id)),
            el("td", null, el("code", null, m.raft_addr || "")),
            el("td", null, m.role || ""),
            el("td", null, m.leader ? "yes" : ""),
            el("td", { class: "num" }, m.matched_index === undefined ? "" : String(m.matched_index)),
            el("td", { class: "num" }, m.lag === undefined ? "" : String(m.lag))
          )
        );
      });
      view.appendChild(t);
    });
  }

  // ---- routing -------------------------------------------------------------

  function show(name) {
    ["search", "agent", "registry", "cluster"].forEach(function (v) {
      $("view-" + v).hidden = v !== name;
    });
    document.body.setAttribute("data-view", name);
  }

  function route() {
    var h = window.location.hash || "#/";
    if (h.indexOf("#/agent/") === 0) {
      var id;
      try {
        id = decodeURIComponent(h.slice("#/agent/".length));
      } catch (e) {
        id = h.slice("#/agent/".length);
      }
      show("agent");
      renderAgent(id);
    } else if (h === "#/registry") {
      show("registry");
      renderRegistry();
    } else if (h === "#/cluster") {
      show("cluster");
      renderCluster();
    } else {
      show("search");
      // "#/?q=…" opens a search (a shareable link; it holds the query only,
      // never a credential).
      var at = h.indexOf("?q=");
      if (at >= 0) {
        var q;
        try {
          q = decodeURIComponent(h.slice(at + 3).replace(/\+/g, " "));
        } catch (e) {
          q = "";
        }
        if (q && q !== state.lastQuery) {
          $("q").value = q;
          search();
        }
      }
    }
  }

  function start() {
    $("search").addEventListener("submit", search);
    $("auth").addEventListener("submit", function (ev) {
      ev.preventDefault();
      useToken($("token").value);
    });
    $("token-forget").addEventListener("click", function () {
      useToken("");
    });
    window.addEventListener("hashchange", route);
    if (state.token) $("token").placeholder = "token in use (hidden)";
    Promise.all([loadRegistry(), probeAdmin()]).then(function () {
      showIdentity();
      document.body.setAttribute("data-ready", "true");
      route();
    });
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
