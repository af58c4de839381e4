/* Small behaviours of Fairlane's pages, wired by data attributes (the CSP allows no inline
   script or event-handler attributes):
   form[data-confirm]   asks before submitting
   [data-copy=selector] copies that field's value to the clipboard
   form[data-switcher]  navigates to the chosen tenant */
(function () {
  "use strict";

  document.addEventListener("submit", function (event) {
    var form = event.target.closest("form[data-confirm]");
    if (form && !window.confirm(form.dataset.confirm)) {
      event.preventDefault();
    }
  }, true);

  document.addEventListener("click", function (event) {
    var button = event.target.closest("[data-copy]");
    if (!button) return;
    var field = document.querySelector(button.dataset.copy);
    var note = button.parentElement.querySelector(".copied");
    field.select();
    var done = function () { if (note) note.textContent = "Copied."; };
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(field.value).then(done, function () {
        document.execCommand("copy"); done();
      });
    } else {
      document.execCommand("copy");
      done();
    }
  });

  document.addEventListener("change", function (event) {
    var select = event.target.closest("form[data-switcher] select");
    if (select) window.location.assign(select.value);
  });
})();
