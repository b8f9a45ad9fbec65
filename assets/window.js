// Runs once when the page loads (launch js=): what Gradio leaves unnamed or open. Its two drawer buttons are both
// "Toggle Sidebar": each gets the name of what it shows. On a phone the conversations drawer covers the chat: it
// closes once a conversation is chosen. Gradio scopes the app's stylesheet inside its content box, so the phone
// padding of the box around it (32 px a side of 390) is set here.
() => {
  const DRAWERS = { 'ls-sidebar': 'Show or hide the conversations', 'ls-settings': 'Show or hide settings and stats' };
  const toggle = (id) => document.querySelector(`#${id} .toggle-button`);
  const name = () => {
    for (const [id, label] of Object.entries(DRAWERS)) {
      const button = toggle(id);
      if (button && button.getAttribute('aria-label') !== label) button.setAttribute('aria-label', label);
    }
  };
  const phone = window.matchMedia('(max-width: 768px)');
  const pad = () => {
    const app = document.querySelector('.gradio-container > .main');
    const want = phone.matches ? '4px' : '';
    if (app && app.style.paddingInline !== want) app.style.paddingInline = want;
  };
  const tidy = () => { name(); pad(); };
  tidy();
  new MutationObserver(tidy).observe(document.body, { childList: true, subtree: true });
  phone.addEventListener('change', pad);
  document.addEventListener('change', (event) => {
    if (!event.target.closest('#ls-conversation') || !window.matchMedia('(max-width: 768px)').matches) return;
    const drawer = document.querySelector('#ls-sidebar');
    if (drawer && drawer.classList.contains('open')) toggle('ls-sidebar').click();
  });
}
