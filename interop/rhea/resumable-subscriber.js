'use strict';
// A resumable eorouter subscriber on rhea (docs/resumption.md; the client side is resumable.js).
//
//   node resumable-subscriber.js HOST PORT TOPIC COUNT --ledger PATH --state PATH [--url HOST:PORT]...
//        [--container-id ID] [--link NAME] [--prefetch N] [--idle-exit S] [--delay-ms MS] [--heartbeat S] [--timeout S]
//
// A durable subscription with rcv-settle-mode=second: each message is handed to the application (here: its
// `delivered` ledger line) exactly once, across router deaths and its own restarts, and accepted; each delivery
// is settled only after the router settled it. Exits 0 once COUNT distinct deliveries are in the ledger (this
// run's and earlier runs') and the router settled them (COUNT 0: runs until --idle-exit, --timeout or SIGTERM).
// Prints "ready <router>" when first attached and a JSON summary at the end; SIGTERM detaches and exits.
const fs = require('fs');
const { ResumableSubscriber, parseArgs } = require('./resumable');

const a = parseArgs('subscriber');
const seen = new Set();
if (fs.existsSync(a.ledger)) {
  for (const line of fs.readFileSync(a.ledger, 'utf8').split('\n')) {
    try { const e = JSON.parse(line); if (e.event === 'delivered') seen.add(e.delivery); } catch (e) { /* torn */ }
  }
}
const SLEEP = new Int32Array(new SharedArrayBuffer(4));
let lastMessage = Date.now();
let sub;
try {
  sub = new ResumableSubscriber({ urls: a.urls, topic: a.topic, container_id: a.container_id, link_name: a.link,
    state_path: a.state, ledger_path: a.ledger, heartbeat: a.heartbeat, connect_timeout: a.connect_timeout,
    prefetch: a.prefetch, terminus_timeout: a.terminus_timeout, verbose: a.verbose,
    on_message: (m) => {
      if (a.delay_ms > 0) Atomics.wait(SLEEP, 0, 0, a.delay_ms); // the application takes this long per message
      seen.add(m.tag.toString('hex')); lastMessage = Date.now(); return null; } });
} catch (e) {
  process.stdout.write(JSON.stringify({ stack: 'rhea', role: 'subscriber', error: e.message }) + '\n');
  process.exit(1);
}
let ready = false;
let exiting = false;
let doneAt = null;
const started = Date.now();

function finish(code, error) {
  if (exiting) return;
  exiting = true;
  clearInterval(timer);
  const summary = { stack: 'rhea', role: 'subscriber', distinct_deliveries: seen.size, delivered_now: sub.delivered,
                    duplicates_suppressed: sub.duplicates, unsettled: sub.unsettledCount, attaches: sub.attaches,
                    complete: Boolean(a.count && seen.size >= a.count), error: error || (sub.error && sub.error.message) || null };
  sub.stop(false, () => {
    process.stdout.write(JSON.stringify(summary) + '\n');
    process.exit(code);
  });
}

function tick() {
  if (exiting) return;
  if (sub.error) { finish(1); return; }
  if (!ready && sub.attached) { ready = true; process.stdout.write(`ready ${sub.router}\n`); }
  const t = Date.now();
  if (a.count && seen.size >= a.count) {
    // let the router's settlements of the last deliveries arrive before detaching
    if (doneAt === null) doneAt = t;
    if (sub.unsettledCount === 0 || t - doneAt > 2000) finish(0);
  } else if (a.idle_exit && (t - lastMessage) / 1000 > a.idle_exit) {
    finish(a.count ? 1 : 0, a.count ? `idle for ${a.idle_exit} s` : null);
  } else if ((t - started) / 1000 > a.timeout) {
    finish(a.count ? 1 : 0, a.count ? `not done after ${a.timeout} s` : null);
  }
}
const timer = setInterval(tick, 20);
process.on('SIGTERM', () => finish(a.count && seen.size < a.count ? 1 : 0, 'SIGTERM'));
sub.start();
