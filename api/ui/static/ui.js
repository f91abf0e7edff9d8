// The UI's live parts; every page reads fine without this script.
// - forms with data-confirm ask in a dialog (their "confirm" box is ticked and hidden);
// - [data-live] on #overview: the server pushes the re-rendered panel over SSE;
// - [data-live] on #output: a running job's output chunks over SSE, then a reload for the result.
"use strict";

function confirmForms() {
  for (const form of document.querySelectorAll("form[data-confirm]")) {
    const box = form.querySelector("input[name=confirm]");
    if (box) {
      box.checked = true;
      box.parentElement.hidden = true;
    }
    form.addEventListener("submit", (event) => {
      if (!window.confirm(form.dataset.confirm)) event.preventDefault();
    });
  }
}

function liveOverview(panel) {
  const source = new EventSource(panel.dataset.live);
  source.addEventListener("overview", (event) => {
    panel.innerHTML = event.data;
    panel.dataset.updates = String(Number(panel.dataset.updates || 0) + 1);
  });
  window.addEventListener("pagehide", () => source.close());
}

function liveOutput(pre) {
  const source = new EventSource(pre.dataset.live);
  source.addEventListener("output", (event) => {
    pre.append(JSON.parse(event.data).data || "");
  });
  source.addEventListener("result", (event) => {
    source.close();
    const state = document.getElementById("job-state");
    if (state) state.textContent = JSON.parse(event.data).state;
    window.location.reload();
  });
  window.addEventListener("pagehide", () => source.close());
}

document.addEventListener("DOMContentLoaded", () => {
  confirmForms();
  const overview = document.querySelector("#overview[data-live]");
  if (overview) liveOverview(overview);
  const output = document.querySelector("#output[data-live]");
  if (output) liveOutput(output);
});
