// Helpers shared by the explorer and the adder page. No framework: plain DOM.
"use strict";

const cl = {
  // fetch JSON; resolves to {ok, status, data}. Errors from the server are {"detail": "..."}.
  async api(path, body) {
    const options = body === undefined ? {} : {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body),
    };
    let response;
    try {
      response = await fetch(path, options);
    } catch (err) {
      return { ok: false, status: 0, data: { detail: "cannot reach the server: " + err.message } };
    }
    let data;
    try {
      data = await response.json();
    } catch (err) {
      data = { detail: "the server answered " + response.status + " without JSON" };
    }
    return { ok: response.ok, status: response.status, data: data };
  },

  // Create an element: cl.el("div", {class: "x", "data-head": "L0H1"}, child, "text", ...)
  el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "text") node.textContent = value;
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, value === true ? "" : String(value));
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  },

  // A token's text with whitespace made visible.
  visible(text) {
    if (text === "") return "∅";
    return text.replace(/ /g, "·").replace(/\n/g, "↵").replace(/\t/g, "⇥").replace(/\r/g, "␍");
  },

  // Text for plotly labels and hovers, which read a few HTML tags: escape them so tokens stay text.
  esc(text) {
    return String(text).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  },

  // Weight in [0, 1] -> colour from white to dark blue.
  heat(w) {
    const t = Math.max(0, Math.min(1, w));
    const r = Math.round(255 - t * (255 - 8));
    const g = Math.round(255 - t * (255 - 48));
    const b = Math.round(255 - t * (255 - 107));
    return "rgb(" + r + "," + g + "," + b + ")";
  },

  // One API call from a form: its button disabled and `busy` shown meanwhile. Resolves to the data,
  // or to null after showing the server's message.
  async submit(button, statusNode, busy, path, body) {
    button.disabled = true;
    cl.status(statusNode, busy, "busy");
    const { ok, data } = await cl.api(path, body);
    button.disabled = false;
    if (!ok) {
      cl.status(statusNode, data.detail || "the request failed", "error");
      return null;
    }
    cl.status(statusNode, "");
    return data;
  },

  status(node, message, kind) {
    node.textContent = message || "";
    node.className = "status" + (kind ? " " + kind : "");
  },

  fmt(x, digits) {
    if (typeof x !== "number") return String(x);
    const d = digits === undefined ? 3 : digits;
    const r = Number(x.toFixed(d));
    return Object.is(r, -0) ? "0" : String(r);
  },
};
