'use strict';
// eorouter interop publisher on rhea. Contract: interop/clientkit.py.
const rhea = require('rhea');
const { parse, connectOptions, errorText, Ledger, body, hex, digest, incarnationOf } = require('./common');

const a = parse('publisher');
const ledger = new Ledger(a);
const counts = { accepted: 0, rejected: 0, released: 0, modified: 0 };
let sent = 0;
let outcomes = 0;
let exitCode = 3;
let error = null;
let finished = false;
let lastProgress = Date.now();

const container = rhea.create_container({ id: a.container_id });
const conn = container.connect(connectOptions(a));
const sender = conn.open_sender({
  name: a.link,
  target: { address: a.topic },
  snd_settle_mode: a.settle === 'presettled' ? 1 : 0,
  autosettle: a.settle === 'default', // rhea's default: settle once the router settled
  treat_modified_as_released: false,
});

function summary(crashed) {
  process.stdout.write(JSON.stringify({ stack: 'rhea', role: 'publisher', sent, outcomes: counts, crashed, error }) + '\n');
}

function finish(code) {
  if (finished) return;
  finished = true;
  exitCode = code;
  clearInterval(timer);
  conn.close();
}

sender.on('sender_open', (context) => {
  ledger.incarnation = incarnationOf(context.sender.remote.attach && context.sender.remote.attach.properties);
});

sender.on('sendable', (context) => {
  while (context.sender.sendable() && sent < a.count && !finished) {
    const seq = ++sent;
    const tag = Buffer.from(String(seq));
    const text = body(a.topic, seq, a.size);
    ledger.write('sent', { seq, pub_tag: hex(tag), digest: digest(text), size: text.length });
    context.sender.send({ application_properties: { seq }, body: text }, tag);
    lastProgress = Date.now();
  }
  if (a.settle === 'presettled' && sent >= a.count) finish(0);
});

function onOutcome(name) {
  return (context) => {
    const d = context.delivery;
    const seq = Number(Buffer.from(d.tag).toString());
    const state = d.remote_state || {};
    const condition = state.error && state.error.condition ? String(state.error.condition) : null;
    ledger.write('outcome', { seq, pub_tag: hex(d.tag), outcome: name, condition });
    if (a.settle === 'on-outcome') d.update(true);
    counts[name] += 1;
    outcomes += 1;
    lastProgress = Date.now();
    if (a.disconnect_after && outcomes >= a.disconnect_after) {
      summary(true);
      process.exit(0); // drop the connection: no close frame
    }
    if (outcomes >= a.count) finish(0);
  };
}
for (const name of ['accepted', 'rejected', 'released', 'modified']) sender.on(name, onOutcome(name));

sender.on('sender_error', (context) => { error = `link: ${errorText(context.sender.error)}`; finish(1); });
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
  if ((Date.now() - lastProgress) / 1000 > a.timeout) {
    error = `no progress for ${a.timeout} s`;
    summary(false);
    process.exit(3);
  }
}, 250);
process.on('exit', () => { if (!finished) exitCode = exitCode || 1; });
