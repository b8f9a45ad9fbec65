// Runs once when the transcript loads (gr.HTML js_on_load; `element` is the transcript's container, kept while its
// HTML is replaced): the copy buttons of code blocks (plain code) and of answers (their markdown source).
element.addEventListener('click', (event) => {
  const button = event.target.closest('.ls-copy, .ls-copy-md');
  if (!button || !element.contains(button)) return;
  const code = button.classList.contains('ls-copy');
  const source = code ? button.closest('.ls-code').querySelector('pre code')
                      : button.closest('.ls-tools').querySelector('.ls-raw');
  const text = source ? source.textContent : '';
  const label = code ? 'copy' : 'copy markdown';
  const shown = (word) => { button.textContent = word; setTimeout(() => { button.textContent = label; }, 1500); };
  const fallback = () => {
    const area = document.createElement('textarea');
    area.value = text;
    area.style.position = 'fixed';
    area.style.opacity = '0';
    document.body.appendChild(area);
    area.select();
    const ok = document.execCommand('copy');
    area.remove();
    shown(ok ? 'copied' : 'copy failed');
  };
  if (navigator.clipboard && window.isSecureContext) {
    navigator.clipboard.writeText(text).then(() => shown('copied'), fallback);
  } else {
    fallback();
  }
});
