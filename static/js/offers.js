// The Offers page: choosing a saved profile loads the page with that profile's recipe and filters.
document.addEventListener("change", (event) => {
  if (event.target.matches("#ranking-form select[name=profile]")) {
    window.location = "?profile=" + encodeURIComponent(event.target.value);
  }
});

// A ranking request that fails (the server answers an error, or cannot be reached) leaves the table as it was, so
// say so in its place instead of showing a stale table as if it were current.
document.addEventListener("htmx:afterRequest", (event) => {
  const ranking = document.getElementById("ranking");
  if (!ranking || event.detail.target !== ranking || event.detail.successful) return;
  const status = event.detail.xhr && event.detail.xhr.status;
  const why = status ? `the server answered ${status}` : "the dashboard could not be reached";
  const note = document.createElement("div");
  note.className = "error";
  note.setAttribute("role", "alert");
  note.id = "ranking-not-updated";
  note.textContent = `The ranking is not updated: ${why}. Change a field to try again, or reload the page.`;
  ranking.replaceChildren(note);
});

// Saving a profile that the server refuses outright (no permission, an error) or cannot be reached says so beside the
// Save button; the fields keep what was typed.
document.addEventListener("htmx:afterRequest", (event) => {
  const status = document.getElementById("profile-not-saved");
  if (!status || !event.detail.elt.matches("form.save-profile") || event.detail.successful) return;
  const code = event.detail.xhr && event.detail.xhr.status;
  status.className = "error";
  status.setAttribute("role", "alert");
  status.textContent = `Profile not saved: ${code ? `the server answered ${code}` : "the dashboard could not be reached"}` +
    ". What you typed is kept; try again.";
});
