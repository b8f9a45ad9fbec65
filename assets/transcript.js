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

// Scroll-follow: the conversation stays at its newest line while an answer streams, unless the reader scrolled up;
// the "jump to latest" chip brings it back. Send and Enter always jump to the bottom.
const scroller = element.closest('.html-container') || element.parentElement || element;
const block = element.closest('#ls-transcript') || scroller;
let follow = true;
const atBottom = () => scroller.scrollHeight - scroller.scrollTop - scroller.clientHeight < 48;
const toBottom = () => { scroller.scrollTop = scroller.scrollHeight; follow = true; };
const overlay = document.createElement('div');
overlay.className = 'ls-overlay';
const chip = document.createElement('button');
chip.type = 'button';
chip.className = 'ls-jump';
chip.textContent = '↓ jump to latest';
chip.hidden = true;
const busy = document.createElement('div');
busy.className = 'ls-busy';
busy.setAttribute('role', 'status');
busy.hidden = true;
overlay.append(busy, chip);
block.appendChild(overlay);
const streaming = () => !!element.querySelector('.ls-cursor');
const refresh = () => {
  if (follow) scroller.scrollTop = scroller.scrollHeight;
  chip.hidden = atBottom();
  document.body.classList.toggle('ls-streaming', streaming());
  if (!streaming()) busy.hidden = true;
};
scroller.addEventListener('scroll', () => { follow = atBottom(); chip.hidden = follow; }, { passive: true });
// a wheel turned up, a touch drag or a key that scrolls up means the reader left the bottom: a stream update landing
// before the scroll event must not pull them back
scroller.addEventListener('wheel', (event) => { if (event.deltaY < 0) follow = false; }, { passive: true });
scroller.addEventListener('touchmove', () => { follow = false; }, { passive: true });
scroller.addEventListener('keydown', (event) => {
  if (['ArrowUp', 'PageUp', 'Home'].includes(event.key)) follow = false;
});
new MutationObserver(refresh).observe(element, { childList: true, subtree: true, characterData: true });
chip.addEventListener('click', () => { toBottom(); chip.hidden = true; });
const sent = () => {
  if (streaming()) {
    busy.textContent = 'An answer is still streaming: press Stop or wait for it; your message stays in the box.';
    busy.hidden = false;
    return;
  }
  toBottom();
};
document.addEventListener('click', (event) => { if (event.target.closest('#ls-send')) sent(); }, true);
document.addEventListener('keydown', (event) => {
  if (event.key === 'Enter' && !event.shiftKey && !event.isComposing && event.target.closest('#ls-message')) sent();
}, true);

// Provenance popover: a token's card (data-tip) on hover, focus and tap; it stays while the pointer is over it,
// its text can be selected and copied (and has a copy button), Escape closes it. In an answer (tabindex 0) the
// arrow keys move from token to token.
const pop = document.createElement('div');
pop.id = 'ls-pop';
pop.className = 'ls-pop';
pop.setAttribute('role', 'tooltip');
pop.hidden = true;
const popText = document.createElement('div');
popText.className = 'ls-pop-text';
const popCopy = document.createElement('button');
popCopy.type = 'button';
popCopy.className = 'ls-pop-copy';
popCopy.textContent = 'copy';
pop.append(popText, popCopy);
document.body.appendChild(pop);
let shownFor = null, pinned = false, hideTimer = null;
const place = (tok) => {
  const r = tok.getBoundingClientRect();
  const w = pop.offsetWidth, h = pop.offsetHeight;
  const left = Math.max(4, Math.min(r.left, window.innerWidth - w - 4));
  const below = r.bottom + 6 + h < window.innerHeight;
  pop.style.left = left + 'px';
  pop.style.top = (below ? r.bottom + 6 : Math.max(4, r.top - h - 6)) + 'px';
};
const show = (tok) => {
  clearTimeout(hideTimer);
  if (shownFor && shownFor !== tok) shownFor.removeAttribute('aria-describedby');
  shownFor = tok;
  popText.textContent = tok.dataset.tip || '';
  popCopy.textContent = 'copy';
  pop.hidden = false;
  tok.setAttribute('aria-describedby', 'ls-pop');
  tok.classList.add('tok-shown');
  place(tok);
};
const hide = () => {
  pop.hidden = true;
  pinned = false;
  if (shownFor) { shownFor.removeAttribute('aria-describedby'); shownFor.classList.remove('tok-shown'); }
  shownFor = null;
};
const later = () => { clearTimeout(hideTimer); hideTimer = setTimeout(() => { if (!pinned) hide(); }, 350); };
const tokenAt = (target) => {
  const tok = target && target.closest ? target.closest('.tok') : null;
  return tok && element.contains(tok) ? tok : null;
};
element.addEventListener('mouseover', (event) => { const tok = tokenAt(event.target); if (tok && !pinned) show(tok); });
element.addEventListener('mouseout', (event) => { if (tokenAt(event.target)) later(); });
element.addEventListener('focusin', (event) => { const tok = tokenAt(event.target); if (tok) show(tok); });
element.addEventListener('focusout', (event) => {
  if (tokenAt(event.target) && !pop.contains(event.relatedTarget)) later();
});
element.addEventListener('click', (event) => {
  const tok = tokenAt(event.target);
  if (!tok) return;
  show(tok);
  pinned = true;  // a tap (or click) keeps the card until a tap elsewhere or Escape
});
pop.addEventListener('mouseenter', () => clearTimeout(hideTimer));
pop.addEventListener('mouseleave', later);
document.addEventListener('click', (event) => {
  if (!pop.hidden && !pop.contains(event.target) && !tokenAt(event.target)) hide();
});
document.addEventListener('keydown', (event) => { if (event.key === 'Escape' && !pop.hidden) hide(); });
scroller.addEventListener('scroll', () => { if (shownFor && !pop.hidden) place(shownFor); }, { passive: true });
popCopy.addEventListener('click', () => {
  const text = popText.textContent;
  const done = (word) => { popCopy.textContent = word; };
  if (navigator.clipboard && window.isSecureContext) {
    navigator.clipboard.writeText(text).then(() => done('copied'), () => done('select the text to copy'));
  } else {
    const range = document.createRange();
    range.selectNodeContents(popText);
    const selection = window.getSelection();
    selection.removeAllRanges();
    selection.addRange(range);
    done(document.execCommand('copy') ? 'copied' : 'select the text to copy');
  }
});
element.addEventListener('keydown', (event) => {
  const body = event.target.closest('.ls-body');
  if (!body || !element.contains(body)) return;
  const toks = [...body.querySelectorAll('.tok')];
  if (!toks.length) return;
  const at = toks.indexOf(event.target);
  let next = null;
  if (event.key === 'ArrowRight' || event.key === 'ArrowDown') next = toks[Math.min(at + 1, toks.length - 1)];
  else if (event.key === 'ArrowLeft' || event.key === 'ArrowUp') next = toks[Math.max(at - 1, 0)];
  else if (event.key === 'Home') next = toks[0];
  else if (event.key === 'End') next = toks[toks.length - 1];
  else if (event.key === 'Escape' && at >= 0) { body.focus(); return; }
  if (next) { event.preventDefault(); next.focus(); }
});

// A narrow window (a phone) opens on the conversation: the sidebars start closed, as drawers.
if (window.innerWidth < 768) {
  let tries = 0;
  const closeDrawers = () => {
    const open = document.querySelectorAll('.sidebar.open .toggle-button');
    open.forEach((button) => button.click());
    if (!open.length && ++tries < 40) setTimeout(closeDrawers, 100);
  };
  closeDrawers();
}

// "keep speculating anyway" under a paused answer's stats ticks the setting of that name (adaptive K off).
document.addEventListener('click', (event) => {
  if (!event.target.closest('.ls-keep-speculating')) return;
  const box = document.querySelector('#ls-keep-speculating input[type=checkbox]');
  if (box && !box.checked) box.click();
  event.target.textContent = 'on for the next answers';
});

// Each message's own controls (localspec/ui/render.py message_tools_html): Edit, Regenerate and the version switch
// ‹ 1/2 › send the message's index to the server as the transcript's events.
element.addEventListener('click', (event) => {
  const button = event.target.closest('[data-ls-action]');
  if (!button || !element.contains(button) || button.disabled) return;
  const index = Number(button.dataset.index);
  const action = button.dataset.lsAction;
  if (action === 'edit') trigger('edit_message', { index });
  else if (action === 'regenerate') trigger('regenerate_answer', { index });
  else if (action === 'switch') trigger('switch_version', { index, step: Number(button.dataset.step) });
});
