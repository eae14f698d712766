// "Copy" buttons: <button class="copy" data-copy="ID"> copies the text of the element with that id. One listener on the
// document, so buttons inside regions htmx swaps in keep working.
document.addEventListener("click", async (event) => {
  const button = event.target.closest("button.copy[data-copy]");
  if (!button) return;
  const source = document.getElementById(button.dataset.copy);
  if (!source) return;
  const text = source.textContent.trim();
  try {
    await navigator.clipboard.writeText(text);
    button.textContent = "Copied";
  } catch (error) {
    // No clipboard here (an address the browser does not count as secure): select the text to copy by hand.
    window.getSelection().selectAllChildren(source);
    button.textContent = "Selected: press Ctrl+C";
  }
  setTimeout(() => { button.textContent = "Copy"; }, 2000);
});
