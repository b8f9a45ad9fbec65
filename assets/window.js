// Runs once when the page loads (launch js=): what Gradio leaves unnamed or open. Its two drawer buttons are both
// "Toggle Sidebar": each gets the name of what it shows. On a phone the conversations drawer covers the chat: it
// closes once a conversation is chosen.
() => {
  const DRAWERS = { 'ls-sidebar': 'Show or hide the conversations', 'ls-settings': 'Show or hide settings and stats' };
  const toggle = (id) => document.querySelector(`#${id} .toggle-button`);
  const name = () => {
    for (const [id, label] of Object.entries(DRAWERS)) {
      const button = toggle(id);
      if (button && button.getAttribute('aria-label') !== label) button.setAttribute('aria-label', label);
    }
  };
  name();
  new MutationObserver(name).observe(document.body, { childList: true, subtree: true });
  document.addEventListener('change', (event) => {
    if (!event.target.closest('#ls-conversation') || !window.matchMedia('(max-width: 768px)').matches) return;
    const drawer = document.querySelector('#ls-sidebar');
    if (drawer && drawer.classList.contains('open')) toggle('ls-sidebar').click();
  });
}
