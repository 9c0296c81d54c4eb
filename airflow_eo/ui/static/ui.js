// Links to Airflow's own pages (target="_top") open in the whole window, not in the UI's frame.
// The UI frames this page in a sandbox without allow-top-navigation: the browser refuses the frame's
// own navigation of the top window (target="_top", top.location), but the sandbox lets the page,
// of the same origin, act in the top document, so a click there is the top window's own.
// Opened in a tab of its own (no frame) the links navigate as any link does.
document.addEventListener("click", function (event) {
  var link = event.target.closest ? event.target.closest("a[target=_top]") : null;
  if (!link || event.defaultPrevented || event.button !== 0 ||
      event.metaKey || event.ctrlKey || event.shiftKey || event.altKey || window.top === window) {
    return;
  }
  var doc;
  try {
    doc = window.top.document;  // another origin: throws, and the link does what the embedding allows
  } catch (error) {
    return;
  }
  event.preventDefault();
  var twin = doc.createElement("a");
  twin.href = link.href;
  twin.style.display = "none";
  doc.body.appendChild(twin);
  twin.click();
});
