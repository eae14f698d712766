// A form marked data-limits is not sent while it would be refused for its size: a field over its data-max-chars, a
// chosen file over data-max-bytes (or two files of one name), or the text fields together over the form's
// data-max-text-bytes (what the dashboard reads of a request's fields). The reason goes beside the field, and what
// was typed stays where it is.
(function () {
  "use strict";
  var number = function (n) { return n.toLocaleString("en-US"); };

  function say(field, message) {
    var holder = field.closest("label") || field.parentElement;
    var note = holder.querySelector(".error[data-limit]");
    if (!message) {
      if (note) note.remove();
      return;
    }
    if (!note) {
      note = document.createElement("span");
      note.className = "error";
      note.setAttribute("data-limit", "");
      note.setAttribute("role", "alert");
      if (field.id) note.id = field.id + "-limit";
      holder.appendChild(note);
    }
    note.textContent = message;
  }

  // Characters as the server counts them: a browser sends each line break of a text area as two.
  function sentChars(field) {
    var value = field.value, breaks = 0;
    if (field.tagName === "TEXTAREA") {
      for (var at = value.indexOf("\n"); at !== -1; at = value.indexOf("\n", at + 1)) breaks += 1;
    }
    return value.length + breaks;
  }

  function checkChars(field) {
    var max = parseInt(field.dataset.maxChars, 10), chars = sentChars(field);
    say(field, chars > max ? "This is " + number(chars) + " characters; at most " + number(max) + " are read. " +
        "Nothing was sent: shorten it, then send again." : "");
    return chars <= max;
  }

  function checkFiles(field) {
    var max = parseInt(field.dataset.maxBytes, 10), seen = {}, problems = [];
    Array.prototype.forEach.call(field.files, function (file) {
      if (file.size > max) {
        problems.push(file.name + " is " + number(file.size) + " bytes; a data file may be at most " + number(max) + ".");
      }
      if (seen[file.name]) problems.push("Two files are named " + file.name + ": a phase names its file by name.");
      seen[file.name] = true;
    });
    say(field, problems.length ? problems.join(" ") + " Nothing was sent: choose other files." : "");
    return !problems.length;
  }

  function checkTotal(form) {
    var limit = parseInt(form.dataset.maxTextBytes || "0", 10);
    if (!limit) return null;
    var total = 0, biggest = null, biggestBytes = -1;
    Array.prototype.forEach.call(form.elements, function (el) {
      if (!el.name || el.type === "file" || el.type === "submit" || el.type === "button") return;
      var bytes = new Blob([el.value]).size;
      total += bytes;
      if (bytes > biggestBytes) { biggest = el; biggestBytes = bytes; }
    });
    if (total <= limit || !biggest) return null;
    say(biggest, "The form's fields come to " + number(total) + " bytes; the dashboard reads at most " +
        number(limit) + ". Nothing was sent: shorten this field, then send again.");
    return biggest;
  }

  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (!form.matches("form[data-limits]")) return;
    var refused = [];
    form.querySelectorAll("[data-max-chars]").forEach(function (f) { if (!checkChars(f)) refused.push(f); });
    form.querySelectorAll("input[type=file][data-max-bytes]").forEach(function (f) { if (!checkFiles(f)) refused.push(f); });
    if (!refused.length) {
      var total = checkTotal(form);
      if (total) refused.push(total);
    }
    if (refused.length) {
      event.preventDefault();
      refused[0].focus();
    }
  });

  document.addEventListener("change", function (event) {
    if (event.target.matches("form[data-limits] input[type=file][data-max-bytes]")) checkFiles(event.target);
  });
  document.addEventListener("input", function (event) {
    var field = event.target;
    if (field.matches("form[data-limits] [data-max-chars]") && (field.closest("label") || field.parentElement)
        .querySelector(".error[data-limit]")) checkChars(field);
  });
})();
