'use strict';
// eorouter interop subscriber on rhea. Contract: interop/clientkit.py.
const rhea = require('rhea');
const { parse, connectOptions, errorText, Ledger, hex, seqOf, digest } = require('./common');

const a = parse('subscriber');
const ledger = new Ledger(a);
let received = 0;
let awaiting = 0; // rcv-settle-mode=second: answered, not yet settled by the router
let doneAt = null;
let finished = false;
let error = null;
let lastProgress = Date.now();

const container = rhea.create_container({ id: a.container_id });
const conn = container.connect(connectOptions(a));
const receiver = conn.open_receiver({
  name: a.link,
  source: a.selector ? { address: a.topic, filter: rhea.filter.selector(a.selector) } : { address: a.topic },
  snd_settle_mode: a.snd_settle_mode === 'settled' ? 1 : 0,
  rcv_settle_mode: a.rcv_settle_mode === 'second' ? 1 : 0,
  autoaccept: false,
  credit_window: a.credit,
});

function summary(crashed) {
  process.stdout.write(JSON.stringify({ stack: 'rhea', role: 'subscriber', received, crashed, error }) + '\n');
}

function checkDone() {
  if (doneAt === null && received >= a.count && awaiting === 0) doneAt = Date.now();
}

receiver.on('receiver_open', () => { process.stdout.write('ready\n'); });

const WORD = { accept: 'accepted', reject: 'rejected', release: 'released', modify: 'modified', hold: 'held' };
receiver.on('message', (context) => {
  const d = context.delivery;
  const m = context.message;
  const seq = seqOf(m);
  const size = typeof m.body === 'string' ? m.body.length : (m.body && m.body.length !== undefined ? m.body.length : null);
  received += 1;
  lastProgress = Date.now();
  const dig = typeof m.body === 'string' || Buffer.isBuffer(m.body) ? digest(m.body) : null;
  if (a.disconnect_after && received >= a.disconnect_after) {
    ledger.write('delivered', { seq, delivery: hex(d.tag), digest: dig, size });
    summary(true);
    process.exit(0); // drop the connection before answering: no disposition, no close frame
  }
  if (d.remote_settled) { // pre-settled by the router (at-most-once)
    ledger.write('delivered', { seq, delivery: hex(d.tag), digest: dig, size, presettled: true });
    d.update(true);
  } else if (a.outcome === 'hold') {
    ledger.write('delivered', { seq, delivery: hex(d.tag), digest: dig, size, held: true });
  } else {
    ledger.write('delivered', { seq, delivery: hex(d.tag), outcome: WORD[a.outcome], digest: dig, size });
    if (a.rcv_settle_mode === 'second') { d.interop_seq = seq; awaiting += 1; }
    // with rcv-settle-mode=second rhea sends these unsettled and settles once the router settled
    if (a.outcome === 'accept') d.accept();
    else if (a.outcome === 'reject') d.reject({ condition: 'interop:rejected', description: 'the interop subscriber rejects' });
    else if (a.outcome === 'release') d.release();
    else d.modified({ delivery_failed: true });
  }
  checkDone();
});

receiver.on('settled', (context) => {
  const d = context.delivery;
  if (d.interop_seq === undefined) return;
  const state = d.remote_state;
  const name = state && state.constructor && state.constructor.composite_type ? state.constructor.composite_type : null;
  ledger.write('settled', { seq: d.interop_seq, delivery: hex(d.tag), outcome: name });
  delete d.interop_seq;
  awaiting -= 1;
  lastProgress = Date.now();
  checkDone();
});

let exitCode = 3;
function finish(code) {
  if (finished) return;
  finished = true;
  exitCode = code;
  clearInterval(timer);
  conn.close();
}
receiver.on('receiver_error', (context) => { error = `link: ${errorText(context.receiver.error)}`; finish(1); });
conn.on('connection_error', (context) => {
  // the router's close with an error, or a refused login (rhea's transport error: context.error)
  error = error || `connection: ${errorText(context.error || context.connection.error)}`;
});
conn.on('disconnected', (context) => {
  if (!finished) { // the socket ended before we were done: a TLS or network failure
    error = error || `disconnected${context.error ? ': ' + errorText(context.error) : ''}`;
    summary(false);
    process.exit(1);
  }
});
conn.on('connection_close', () => {
  if (!finished) exitCode = 1; // closed on us (or a refused login) before the end
  summary(false);
  process.exit(exitCode);
});
const timer = setInterval(() => {
  if (doneAt !== null) {
    if ((Date.now() - doneAt) / 1000 >= a.linger) finish(0);
  } else if ((Date.now() - lastProgress) / 1000 > a.timeout) {
    error = `no progress for ${a.timeout} s`;
    summary(false);
    process.exit(3);
  }
}, 50);
