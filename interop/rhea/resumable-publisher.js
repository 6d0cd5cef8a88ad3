'use strict';
// A resumable eorouter publisher on rhea (docs/resumption.md; the client side is resumable.js).
//
//   node resumable-publisher.js HOST PORT TOPIC COUNT --ledger PATH --state PATH [--url HOST:PORT]...
//        [--container-id ID] [--link NAME] [--size N] [--window N] [--rate R] [--heartbeat S] [--timeout S]
//
// Sends messages with application property seq = 1..COUNT (body "<topic>#<seq>:xxx", --size bytes), at most
// --window unanswered, --rate per second (0: as credit allows), and exits 0 once every one has an outcome and
// nothing is unsettled. A router that dies is left for the next one (the configured list, then what routers
// advertise in failover-server-list); the link is resumed and every unsettled delivery resent. Run again with
// the same state file after a crash, it resumes and goes on from the next seq. Prints "ready <router>" when
// first attached and a JSON summary at the end; SIGTERM detaches and exits.
const { ResumablePublisher, parseArgs } = require('./resumable');
const { body } = require('./common');

const a = parseArgs('publisher');
const counts = { accepted: 0, rejected: 0, released: 0, modified: 0 };
let pub;
try {
  pub = new ResumablePublisher({ urls: a.urls, topic: a.topic, container_id: a.container_id, link_name: a.link,
    state_path: a.state, ledger_path: a.ledger, heartbeat: a.heartbeat, connect_timeout: a.connect_timeout,
    verbose: a.verbose, on_outcome: (o) => { counts[o.state] += 1; } });
} catch (e) {
  process.stdout.write(JSON.stringify({ stack: 'rhea', role: 'publisher', error: e.message }) + '\n');
  process.exit(1);
}
const first = pub.state.nextSeq;
let seq = first;
let ready = false;
let exiting = false;
const started = Date.now();

function finish(code, error) {
  if (exiting) return;
  exiting = true;
  clearInterval(timer);
  const summary = { stack: 'rhea', role: 'publisher', sent_from: first, next_seq: pub.state.nextSeq, outcomes: counts,
                    unsettled: pub.unsettledCount, resent: pub.resentCount, attaches: pub.attaches,
                    incarnation: pub.incarnation, complete: code === 0, error: error || (pub.error && pub.error.message) || null };
  pub.stop(false, () => {
    process.stdout.write(JSON.stringify(summary) + '\n');
    process.exit(code);
  });
}

let credit = 0; // --rate: messages we may still send now
let lastTick = Date.now();
function tick() {
  if (exiting) return;
  if (pub.error) { finish(1); return; }
  if (!ready && pub.attached) { ready = true; process.stdout.write(`ready ${pub.router}\n`); }
  const t = Date.now();
  if (a.rate > 0) credit = Math.min(credit + (t - lastTick) / 1000 * a.rate, Math.max(1, a.rate / 10));
  lastTick = t;
  while (ready && seq <= a.count && pub.pending.length + pub.unsettledCount < a.window && (a.rate <= 0 || credit >= 1)) {
    pub.send({ body: body(a.topic, seq, a.size) }, seq);
    seq += 1;
    credit -= 1;
  }
  if (seq > a.count && pub.idle()) finish(0);
  else if ((t - started) / 1000 > a.timeout) finish(1, `not done after ${a.timeout} s`);
}
pub.listeners.push(() => { if (!exiting) setImmediate(tick); });
const timer = setInterval(tick, 10);
process.on('SIGTERM', () => finish(1, 'SIGTERM'));
pub.start();
