'use strict';
// Resumable eorouter clients on rhea: the client side of docs/resumption.md, as router/client (Python) does it.
//
// - identity (container-id, link name), incarnation, tag counter and unsettled state live in a local state
//   file: a JSON snapshot plus an append-only journal, in the same format as router/client/state.py (a Python
//   client can resume from a rhea client's file and back); every change is written (synchronously) before the
//   frame it implies leaves the process;
// - reconnection is ours (rhea's `reconnect` is off: it would re-attach without the resume properties and
//   silently drop in-flight deliveries): on any loss we take the next URL of the configured list merged with
//   every router's `failover-server-list`, and attach again with `eorouter:resume`, `eorouter:unsettled`
//   (and `eorouter:incarnation` for a publisher) in the link's attach properties;
// - publisher: after the router's attach, every unsettled delivery is resent with its original tag and bytes,
//   in order, before anything new (docs/resumption.md, "Publishers", step 3);
// - subscriber: durable source, rcv-settle-mode=second; a reported tag missing from the router's answer is
//   settled; a delivery whose tag was already handed to the application is answered as before and not
//   handed over again (docs/resumption.md, "Subscribers");
// - both write the ledger of docs/ledger.md (sent / outcome / delivered / resumed / failover).
const fs = require('fs');
const path = require('path');
const rhea = require('rhea');
const { now, digest, inlinePubTag } = require('./common');

const RESUME = 'eorouter:resume';
const INCARNATION = 'eorouter:incarnation';
const UNSETTLED = 'eorouter:unsettled';
const INCOMPLETE = 'eorouter:incomplete-unsettled';
const FAILOVER_SERVER_LIST = 'failover-server-list';
const STATES = ['none', 'accepted', 'rejected', 'released', 'modified'];
const TERMINAL = new Set(STATES.slice(1));
const STOLEN = 'amqp:link:stolen';
const FATAL_REFUSALS = new Set(['amqp:invalid-field', 'amqp:not-found', 'amqp:unauthorized-access',
  'amqp:not-implemented', 'amqp:not-allowed', 'amqp:precondition-failed', 'amqp:decode-error']);
const MAX_TAG_SIZE = 32;

// ------------------------------------------------------------------------------------------- protocol

// Upper bounds of the AMQP encoding of the eorouter:unsettled list (router/client/protocol.py's, exactly).
const MIN_MAX_FRAME = 512;
const DEFAULT_LIST_CAP = 1024 * 1024;
const ATTACH_RESERVE = 1024;
function strSize(n) { return n <= 255 ? 2 + n : 5 + n; }
function entrySize(tag, state) { return 9 + strSize(tag.length) + strSize(Buffer.byteLength(state)); }

function unsettledBudget(remoteMaxFrame, name, address, cap) {
  let frame = remoteMaxFrame || 2 ** 32 - 1;
  frame = Math.max(frame, MIN_MAX_FRAME);
  let overhead = ATTACH_RESERVE + 5 + Buffer.byteLength(name) + 2 * (5 + Buffer.byteLength(address || ''));
  for (const k of [RESUME, INCARNATION, UNSETTLED, INCOMPLETE]) overhead += strSize(k.length);
  overhead += 2 * 133;
  return Math.max(0, Math.min(cap === undefined ? DEFAULT_LIST_CAP : cap, frame - overhead));
}

// The longest prefix (oldest first) whose encoding fits `budget` bytes, and whether anything was left out.
function cutUnsettled(entries, budget) {
  let used = 9;
  for (let i = 0; i < entries.length; i++) {
    used += entrySize(entries[i][0], entries[i][1]);
    if (used > budget) return [entries.slice(0, i), true];
  }
  return [entries.slice(), false];
}

function checkEntry(tag, state) {
  if (!Buffer.isBuffer(tag) || tag.length < 1 || tag.length > MAX_TAG_SIZE) {
    throw new Error(`unsettled tag must be 1..${MAX_TAG_SIZE} bytes of binary, got ${tag}`);
  }
  if (typeof state !== 'string' || !STATES.includes(state)) throw new Error(`bad unsettled state ${state}`);
  return [tag, state];
}

// Link properties of a resuming attach (rhea sends `properties` keys as symbols), the entries reported, cut?
function resumeProperties(entries, budget, incarnation) {
  const [reported, incomplete] = cutUnsettled(entries.map(([t, s]) => checkEntry(t, s)), budget);
  const props = { [RESUME]: true, [UNSETTLED]: reported.map(([t, s]) => [t, s]) };
  if (incarnation) props[INCARNATION] = incarnation;
  if (incomplete) props[INCOMPLETE] = true;
  return { props, reported, incomplete };
}

// The router's attach properties: {incarnation, unsettled: Map(hex -> state) or null (no eorouter:unsettled
// at all: a router that does not implement resumption), incomplete}.
function readAnswer(properties) {
  const props = properties || {};
  const inc = props[INCARNATION];
  const incarnation = typeof inc === 'string' && inc ? inc : null;
  const raw = props[UNSETTLED];
  let unsettled = null;
  if (raw !== undefined && raw !== null) {
    if (!Array.isArray(raw)) throw new Error(`${UNSETTLED} must be a list of [tag, state] pairs`);
    unsettled = new Map();
    for (const item of raw) {
      if (!Array.isArray(item) || item.length !== 2) throw new Error(`${UNSETTLED} entry must be a pair`);
      const [tag, state] = checkEntry(Buffer.isBuffer(item[0]) ? item[0] : Buffer.from(item[0] || []), item[1]);
      unsettled.set(tag.toString('hex'), state);
    }
  }
  return { incarnation, unsettled, incomplete: Boolean(props[INCOMPLETE]) };
}

function normaliseUrl(url) {
  let text = String(url).trim();
  if (text.includes('://')) {
    const [scheme, rest] = text.split('://', 2);
    if (scheme !== 'amqp') throw new Error(`unsupported scheme in ${url} (only amqp)`);
    text = rest;
  }
  text = text.split('/')[0];
  if (text.includes('@')) text = text.slice(text.lastIndexOf('@') + 1);
  if (text.startsWith('[')) return text.includes(']:') ? text : `${text}:5672`;
  return text.includes(':') ? text : `${text}:5672`;
}

function splitUrl(url) {
  const i = url.lastIndexOf(':');
  return [url.slice(0, i).replace(/^\[|\]$/g, ''), Number(url.slice(i + 1))];
}

// host:port for each usable amqp entry of a router's failover-server-list (open frame properties).
function failoverUrls(connectionProperties) {
  const entries = (connectionProperties || {})[FAILOVER_SERVER_LIST];
  if (!Array.isArray(entries)) return [];
  const out = [];
  for (const entry of entries) {
    if (!entry || typeof entry !== 'object' || Array.isArray(entry)) continue;
    const scheme = String(entry.scheme || 'amqp');
    if (scheme !== 'amqp') continue;
    const host = entry['network-host'] || entry.hostname;
    const port = Number(String(entry.port === undefined ? 5672 : entry.port));
    if (!host || !Number.isInteger(port) || port <= 0 || port >= 65536) continue;
    out.push(String(host).includes(':') ? `[${host}]:${port}` : `${host}:${port}`);
  }
  return out;
}

// Configured URLs first, then the advertised ones not known yet, in the order first seen.
function mergeUrls(configured, advertised) {
  const out = [];
  for (const u of configured.concat(advertised)) {
    const n = normaliseUrl(u);
    if (!out.includes(n)) out.push(n);
  }
  return out;
}

class Backoff { // the first pass over the URL list goes at once, then the delay doubles per pass
  constructor(initial = 0.1, maximum = 2.0) { this.initial = initial; this.maximum = maximum; this.failures = 0; }
  nextDelay(nUrls) {
    const passes = Math.floor(this.failures / Math.max(1, nUrls));
    this.failures += 1;
    return passes === 0 ? 0 : Math.min(this.maximum, this.initial * 2 ** (passes - 1));
  }
  reset() { this.failures = 0; }
}

// ------------------------------------------------------------------------------------------- state file

const FORMAT = 'eorouter-client-state';
const VERSION = 1;

class StateError extends Error {}

function atomicWrite(file, text) {
  const tmp = `${file}.tmp`;
  const fd = fs.openSync(tmp, 'w');
  try { fs.writeSync(fd, text); } finally { fs.closeSync(fd); }
  fs.renameSync(tmp, file);
}

// Snapshot (<path>) + journal (<path>.journal, first line {"generation": g}): router/client/state.py's Store.
class Store {
  constructor(file) {
    this.path = file;
    this.journalPath = `${file}.journal`;
    this.generation = 0;
    this.ops = 0;
    this.fd = null;
  }
  load() {
    let snapshot = null;
    if (fs.existsSync(this.path)) {
      try { snapshot = JSON.parse(fs.readFileSync(this.path, 'utf8')); } catch (e) {
        throw new StateError(`${this.path}: not a state file (${e.message})`);
      }
      if (!snapshot || snapshot.format !== FORMAT) throw new StateError(`${this.path}: not an eorouter client state file`);
      if (snapshot.version !== VERSION) throw new StateError(`${this.path}: state version ${snapshot.version}`);
      this.generation = Number(snapshot.generation || 0);
    }
    const ops = [];
    if (fs.existsSync(this.journalPath)) {
      const lines = fs.readFileSync(this.journalPath).toString('utf8').split('\n');
      let header = null;
      for (let i = 0; i < lines.length; i++) {
        if (!lines[i].trim()) continue;
        let item;
        try { item = JSON.parse(lines[i]); } catch (e) {
          if (i === lines.length - 1) break; // a torn tail: the write was cut by a kill
          throw new StateError(`${this.journalPath}: line ${i + 1} is not JSON`);
        }
        if (header === null) {
          header = item;
          if (header.generation !== this.generation) break; // already folded into the snapshot
          continue;
        }
        ops.push(item);
      }
    }
    return [snapshot, ops];
  }
  writeSnapshot(data) {
    this.close();
    this.generation += 1;
    fs.mkdirSync(path.dirname(path.resolve(this.path)), { recursive: true });
    atomicWrite(this.path, JSON.stringify(Object.assign({ format: FORMAT, version: VERSION, generation: this.generation }, data)));
    atomicWrite(this.journalPath, JSON.stringify({ generation: this.generation }) + '\n');
    this.fd = fs.openSync(this.journalPath, 'a');
    this.ops = 0;
  }
  append(op) {
    if (this.fd === null) this.fd = fs.openSync(this.journalPath, 'a');
    fs.writeSync(this.fd, JSON.stringify(op) + '\n'); // in the OS before we go on: a killed process loses nothing
    this.ops += 1;
  }
  close() {
    if (this.fd !== null) { fs.closeSync(this.fd); this.fd = null; }
  }
}

class ClientState {
  constructor(file, role, identity, compactMin = 1000) {
    this.role = role;
    Object.assign(this, identity); // container_id, link_name, topic
    this.attachedOnce = false;
    this.compactMin = compactMin;
    this.store = new Store(file);
    const [snapshot, ops] = this.store.load();
    if (snapshot !== null) {
      const mine = { role, container_id: identity.container_id, link_name: identity.link_name, topic: identity.topic };
      for (const k of Object.keys(mine)) {
        if (snapshot[k] !== mine[k]) {
          throw new StateError(`${file} belongs to ${JSON.stringify({ role: snapshot.role, container_id: snapshot.container_id,
            link_name: snapshot.link_name, topic: snapshot.topic })}, not ${JSON.stringify(mine)}`);
        }
      }
      this.attachedOnce = Boolean(snapshot.attached_once);
      this.loadSnapshot(snapshot);
    }
    for (const op of ops) this.apply(op);
    this.resumedFromFile = snapshot !== null || ops.length > 0;
    this.compact();
  }
  identity() {
    return { role: this.role, container_id: this.container_id, link_name: this.link_name, topic: this.topic,
             attached_once: this.attachedOnce };
  }
  record(op) {
    this.apply(op);
    this.store.append(op);
    if (this.store.ops > Math.max(this.compactMin, 2 * this.size())) this.compact();
  }
  compact() { this.store.writeSnapshot(Object.assign(this.identity(), this.snapshot())); }
  close() { this.store.close(); }
  recordAttached() { if (!this.attachedOnce) this.record({ op: 'attached' }); }
  apply(op) {
    if (op.op === 'attached') this.attachedOnce = true;
    else throw new StateError(`${this.store.journalPath}: unknown operation ${JSON.stringify(op)}`);
  }
}

// Incarnation, tag and seq counters, and the sent-unsettled deliveries in send order (hex tag -> entry).
class PublisherState extends ClientState {
  constructor(file, identity) {
    const pre = { incarnation: null, next_tag: 1, next_seq: 1, unsettled: new Map() };
    super(file, 'publisher', Object.assign({}, identity, { _pre: pre }));
  }
  get unsettled() { return this._pre.unsettled; }
  get incarnation() { return this._pre.incarnation; }
  get nextSeq() { return this._pre.next_seq; }
  recordIncarnation(value) { if (value !== this._pre.incarnation) this.record({ op: 'incarnation', value }); }
  // Allocate the next tag for `payload` (the encoded message) and journal it: the tag (Buffer).
  recordSent(payload, seq) {
    const n = this._pre.next_tag;
    this.record({ op: 'sent', n, seq, msg: payload.toString('base64') });
    return Buffer.from(String(n), 'ascii');
  }
  recordSettled(hex) { if (this.unsettled.has(hex)) this.record({ op: 'settled', tag: hex }); }
  entries() { return Array.from(this.unsettled.values(), (e) => [e.tag, e.outcome || 'none']); }
  apply(op) {
    const p = this._pre;
    if (op.op === 'sent') {
      const tag = Buffer.from(String(op.n), 'ascii');
      p.unsettled.set(tag.toString('hex'), { tag, payload: Buffer.from(op.msg, 'base64'), seq: op.seq === undefined ? null : op.seq, outcome: null });
      p.next_tag = Math.max(p.next_tag, Number(op.n) + 1);
      if (op.seq !== null && op.seq !== undefined) p.next_seq = Math.max(p.next_seq, Number(op.seq) + 1);
    } else if (op.op === 'outcome') {
      const e = p.unsettled.get(op.tag);
      if (e) e.outcome = op.outcome;
    } else if (op.op === 'settled') {
      p.unsettled.delete(op.tag);
    } else if (op.op === 'incarnation') {
      p.incarnation = op.value;
    } else {
      super.apply(op);
    }
  }
  size() { return this.unsettled.size; }
  snapshot() {
    const p = this._pre;
    return { incarnation: p.incarnation, next_tag: p.next_tag, next_seq: p.next_seq,
             unsettled: Array.from(p.unsettled.values(), (e) => ({ tag: e.tag.toString('hex'), seq: e.seq, outcome: e.outcome,
                                                                     message: e.payload.toString('base64') })) };
  }
  loadSnapshot(s) {
    const p = this._pre;
    p.incarnation = s.incarnation === undefined ? null : s.incarnation;
    p.next_tag = Number(s.next_tag || 1);
    p.next_seq = Number(s.next_seq || 1);
    for (const item of s.unsettled || []) {
      if (item.outcome !== null && item.outcome !== undefined && !TERMINAL.has(item.outcome)) {
        throw new StateError(`${this.store.path}: bad outcome ${item.outcome}`);
      }
      const tag = Buffer.from(item.tag, 'hex');
      p.unsettled.set(item.tag, { tag, payload: Buffer.from(item.message, 'base64'), seq: item.seq, outcome: item.outcome || null });
    }
  }
}

// Deliveries held unsettled (hex tag -> our answer, arrival order) and the dedup set of settled ones
// (hex tag -> [when, answer]), trimmed to the newest `dedup_window` but never younger than `dedup_linger` s.
class SubscriberState extends ClientState {
  constructor(file, identity, dedupWindow = 10000, dedupLinger = 600) {
    const pre = { unsettled: new Map(), settled: new Map(), dedup_window: dedupWindow, dedup_linger: dedupLinger };
    super(file, 'subscriber', Object.assign({}, identity, { _pre: pre }));
  }
  get unsettled() { return this._pre.unsettled; }
  get settled() { return this._pre.settled; }
  seen(hex) {
    if (this.unsettled.has(hex)) return this.unsettled.get(hex);
    const s = this.settled.get(hex);
    return s === undefined ? null : s[1];
  }
  recordDelivered(hex, state, settled) {
    const op = { op: 'recv', tag: hex, state };
    if (settled) op.settled_at = now();
    this.record(op);
  }
  recordSettled(hex) { if (this.unsettled.has(hex)) this.record({ op: 'settled', tag: hex, at: now() }); }
  entries() { return Array.from(this.unsettled, ([hex, state]) => [Buffer.from(hex, 'hex'), state]); }
  trim(at) {
    const t = at === undefined ? now() : at;
    const p = this._pre;
    let dropped = 0;
    while (p.settled.size > p.dedup_window) {
      const [hex, [when]] = p.settled.entries().next().value;
      if (when > t - p.dedup_linger) break;
      p.settled.delete(hex);
      dropped += 1;
    }
    return dropped;
  }
  apply(op) {
    const p = this._pre;
    if (op.op === 'recv') {
      if (op.settled_at !== undefined) {
        p.unsettled.delete(op.tag);
        p.settled.delete(op.tag);
        p.settled.set(op.tag, [Number(op.settled_at), op.state]);
      } else {
        p.unsettled.set(op.tag, op.state);
      }
    } else if (op.op === 'settled') {
      const state = p.unsettled.get(op.tag);
      if (state !== undefined) {
        p.unsettled.delete(op.tag);
        p.settled.delete(op.tag);
        p.settled.set(op.tag, [Number(op.at), state]);
        this.trim(Number(op.at));
      }
    } else {
      super.apply(op);
    }
  }
  size() { return this.unsettled.size + this.settled.size; }
  snapshot() {
    const p = this._pre;
    return { unsettled: Array.from(p.unsettled), settled: Array.from(p.settled, ([h, [at, s]]) => [h, at, s]),
             dedup_window: p.dedup_window, dedup_linger: p.dedup_linger };
  }
  loadSnapshot(s) {
    const p = this._pre;
    for (const [hex, state] of s.unsettled || []) {
      if (!STATES.includes(state)) throw new StateError(`${this.store.path}: bad state ${state}`);
      p.unsettled.set(hex, state);
    }
    for (const [hex, at, state] of s.settled || []) p.settled.set(hex, [Number(at), state]);
  }
}

// ------------------------------------------------------------------------------------------- ledger

const LEDGER_EVENTS = ['sent', 'outcome', 'delivered', 'resumed', 'failover'];

class Ledger { // docs/ledger.md: every standard field, in order, then the event's extras
  constructor(file, client, link, role, topic) {
    this.common = { client, link, role, topic };
    this.fd = file ? fs.openSync(file, 'a') : null;
  }
  write(event, f) {
    if (!LEDGER_EVENTS.includes(event)) throw new Error(`unknown ledger event ${event}`);
    const line = { ts: now(), client: this.common.client, link: this.common.link, role: this.common.role, event,
                   topic: this.common.topic, delivery: null, pub_tag: null, seq: null, outcome: null, router: null,
                   incarnation: null, digest: null, message_id: null };
    for (const [k, v] of Object.entries(f || {})) line[k] = v === undefined ? null : v;
    if (this.fd !== null) fs.writeSync(this.fd, JSON.stringify(line) + '\n');
    return line;
  }
  close() { if (this.fd !== null) { fs.closeSync(this.fd); this.fd = null; } }
}

// BLAKE2b-128 of Message(body=...).encode() as python-qpid-proton writes it (docs/ledger.md): strings and
// binaries; null for other bodies.
function bodyDigest(body) {
  if (typeof body === 'string') return digest(body);
  if (Buffer.isBuffer(body)) {
    const head = Buffer.from('0053704500537345005377', 'hex');
    let size;
    if (body.length <= 255) size = Buffer.from([0xa0, body.length]);
    else { size = Buffer.alloc(5); size[0] = 0xb0; size.writeUInt32BE(body.length, 1); }
    return require('./blake2b').blake2b(Buffer.concat([head, size, body]), 16).toString('hex');
  }
  return null;
}

function messageIdOf(message) {
  const id = message && message.message_id;
  if (id === undefined || id === null) return null;
  return Buffer.isBuffer(id) ? id.toString('hex') : String(id);
}

function outcomeName(state) {
  const name = state && state.constructor ? state.constructor.composite_type : null;
  return TERMINAL.has(name) ? name : null;
}

function outcomeState(name) { // our answer as rhea's delivery state
  if (name === 'accepted') return rhea.message.accepted().described();
  if (name === 'rejected') return rhea.message.rejected({}).described();
  if (name === 'released') return rhea.message.released().described();
  if (name === 'modified') return rhea.message.modified({ delivery_failed: true }).described();
  return undefined;
}

// ------------------------------------------------------------------------------------------- client

class ClientError extends Error {}

// One connection, one session, one link at a time:
//   connect(url) -> router's open (merge its failover-server-list) -> attach (resume properties once attached
//   before) -> router's attach (read its answer) = "attached";
//   socket error / close / idle timeout / the router closing or detaching us -> forget that connection, next
//   URL after a backoff. Events of a connection we gave up on are ignored (generation counter).
class ResumableClient {
  constructor(o, role, state) {
    if (!o.urls || !o.urls.length) throw new Error('at least one router URL is needed');
    this.role = role;
    this.configuredUrls = o.urls.map(normaliseUrl);
    this.urls = this.configuredUrls.slice();
    this.topic = o.topic;
    this.containerId = o.container_id;
    this.linkName = o.link_name;
    this.state = state;
    this.ledger = new Ledger(o.ledger_path, o.container_id, o.link_name, role, o.topic);
    this.heartbeat = o.heartbeat === undefined ? 2.0 : o.heartbeat;
    this.connectTimeout = o.connect_timeout === undefined ? 5.0 : o.connect_timeout;
    this.backoff = new Backoff(o.backoff_initial, o.backoff_max);
    this.unsettledCap = o.unsettled_cap;
    this.verbose = Boolean(o.verbose);
    this.container = rhea.create_container({ id: o.container_id });
    // a link or connection error nobody handled would be thrown from the container: note it, never crash
    this.container.on('error', (err) => this.note('rhea-error', String(err && err.message)));
    this.gen = 0;
    this.urlIndex = -1;
    this.conn = null;
    this.link = null;
    this.attached = false;
    this.stopping = false;
    this.refused = false;
    this.connectTimer = null;
    this.previousRouter = null;
    this.router = null;
    this.attaches = 0;
    this.error = null;
    this.lastResume = null;
    this.history = [];
    this.listeners = [];
    this.onStopped = null;
  }

  note(event, detail) {
    this.history.push([now(), event, detail || '']);
    if (this.history.length > 1000) this.history.shift();
    if (this.verbose) process.stderr.write(`${new Date().toISOString()} ${this.role} ${this.containerId}: ${event} ${detail || ''}\n`);
  }

  changed() { for (const fn of this.listeners.slice()) fn(); }

  start() { this.connectNext(); return this; }

  connectNext() {
    if (this.stopping) return;
    this.gen += 1;
    const gen = this.gen;
    this.urlIndex = (this.urlIndex + 1) % this.urls.length;
    const url = this.urls[this.urlIndex];
    this.note('connect', url);
    this.attached = false;
    this.refused = false;
    this.link = null;
    const [host, port] = splitUrl(url);
    const live = (fn) => (...args) => { if (gen === this.gen && !this.stopping) fn(...args); };
    // rhea declares the peer dead after 2 x its own idle_time_out without a frame (the router sends one at half
    // of it): a dead or stalled router is noticed after about `heartbeat` seconds.
    const options = { host, port, reconnect: false, container_id: this.containerId, id: `${this.containerId}#${gen}` };
    if (this.heartbeat) options.idle_time_out = Math.max(100, Math.round(this.heartbeat * 1000 / 2));
    const conn = this.container.connect(options);
    this.conn = conn;
    conn.on('connection_open', live((ctx) => this.onConnectionOpen(ctx.connection, gen)));
    conn.on('connection_close', live((ctx) => {
      const e = ctx.connection.error;
      this.lost(`router closed the connection${e ? ': ' + (e.condition || '') + ' ' + (e.description || '') : ''}`,
                e && e.condition ? String(e.condition) : null);
    }));
    conn.on('connection_error', () => {}); // connection_close follows
    conn.on('disconnected', live((ctx) => this.lost(`disconnected${ctx.error ? ': ' + (ctx.error.message || ctx.error) : ''}`)));
    conn.on('protocol_error', live((err) => this.lost(`protocol error: ${err}`)));
    conn.on('error', live((err) => this.lost(`connection error: ${err && err.message}`)));
    if (this.connectTimer) clearTimeout(this.connectTimer);
    this.connectTimer = setTimeout(live(() => {
      if (!this.attached) this.abort(`no attached link within ${this.connectTimeout} s`);
    }), this.connectTimeout * 1000);
  }

  onConnectionOpen(conn, gen) {
    const advertised = failoverUrls(conn.properties);
    if (advertised.length) {
      const merged = mergeUrls(this.urls, advertised);
      if (merged.join(',') !== this.urls.join(',')) {
        const current = this.urls[this.urlIndex];
        this.urls = merged;
        this.urlIndex = this.urls.indexOf(current);
        this.note('failover-list', this.urls.join(','));
      }
    }
    const props = this.resumeProps(conn);
    const link = this.makeLink(conn, props);
    this.link = link;
    const live = (fn) => (...args) => { if (gen === this.gen && !this.stopping && this.link === link) fn(...args); };
    const prefix = this.role === 'publisher' ? 'sender_' : 'receiver_';
    link.on(`${prefix}open`, live((ctx) => this.onLinkOpen(link)));
    const gone = live((ctx) => {
      const e = link.error;
      const cond = e && e.condition ? String(e.condition) : null;
      this.lost(`router ${this.refused ? 'refused' : 'detached'} the link${e ? ': ' + (cond || '') + ' ' + (e.description || '') : ''}`, cond);
    });
    link.on(`${prefix}error`, () => {}); // the close follows with the same error
    link.on(`${prefix}close`, gone);
    this.bindLink(link, live);
  }

  resumeProps(conn) {
    // The first attach says only that we resume after a failure: a router then settles a publisher's deliveries in
    // two steps (docs/delivery-rule.md, "Settlement").
    if (!this.state.attachedOnce) { this.lastResume = null; return { [RESUME]: false }; }
    const remoteMax = conn.max_frame_size || 0;
    const budget = unsettledBudget(remoteMax, this.linkName, this.topic, this.unsettledCap);
    const r = resumeProperties(this.state.entries(), budget, this.incarnationToPresent());
    this.lastResume = Object.assign(r, { budget, remoteMax });
    return r.props;
  }

  incarnationToPresent() { return null; }

  onLinkOpen(link) {
    const terminus = this.role === 'publisher' ? link.remote.attach.target : link.remote.attach.source;
    if (!terminus) { this.refused = true; return; } // refused: no terminus, a detach follows
    if (this.connectTimer) { clearTimeout(this.connectTimer); this.connectTimer = null; }
    let answer;
    try { answer = readAnswer(link.remote.attach.properties); } catch (e) {
      this.note('bad-answer', e.message);
      answer = { incarnation: null, unsettled: null, incomplete: false };
    }
    this.lastAnswer = answer;
    const url = this.urls[this.urlIndex];
    const resumed = this.lastResume !== null;
    this.router = url;
    this.attached = true;
    this.attaches += 1;
    this.backoff.reset();
    if (this.previousRouter !== null) this.ledger.write('failover', { router: url, from: this.previousRouter });
    this.previousRouter = url;
    this.note('attached', `${url} resumed=${resumed}`);
    this.attachedHook(link, answer, resumed);
    this.state.recordAttached();
    this.changed();
  }

  abort(reason) {
    const conn = this.conn;
    if (conn === null) return;
    this.lost(reason);
  }

  // The current connection or link is gone: forget it and fail over.
  lost(reason, condition) {
    if (this.stopping) return;
    this.gen += 1; // every later event of the old connection is ignored
    const wasAttached = this.attached;
    this.attached = false;
    this.link = null;
    const conn = this.conn;
    this.conn = null;
    if (conn !== null) dropConnection(conn);
    if (this.connectTimer) { clearTimeout(this.connectTimer); this.connectTimer = null; }
    this.router = null;
    this.note('lost', reason);
    this.lostHook(wasAttached);
    if (condition === STOLEN || (this.refused && FATAL_REFUSALS.has(condition))) {
      this.error = new ClientError(condition === STOLEN
        ? `link ${this.containerId}/${this.linkName} was taken over by another attach with the same container-id and link name; stopping`
        : `router refused link ${this.containerId}/${this.linkName}: ${reason}`);
      this.note('error', this.error.message);
      this.stop(false);
      return;
    }
    const delay = this.backoff.nextDelay(this.urls.length);
    this.changed();
    if (delay > 0) setTimeout(() => this.connectNext(), delay * 1000); else this.connectNext();
  }

  // Detach the link (the terminus stays resumable; closeTerminus: close it), close the connection; calls
  // `done` once the router answered or after a short grace.
  stop(closeTerminus, done) {
    if (this.stopping) { if (done) done(); return; }
    this.stopHook();
    this.stopping = true;
    const link = this.link;
    const conn = this.conn;
    let finished = false;
    const finish = () => {
      if (finished) return;
      finished = true;
      if (this.connectTimer) clearTimeout(this.connectTimer);
      if (conn) dropConnection(conn);
      this.state.close();
      this.ledger.close();
      this.attached = false;
      this.changed();
      if (done) done();
      if (this.onStopped) this.onStopped();
    };
    if (conn && link && this.attached) {
      if (closeTerminus) link.close(); else link.detach();
      conn.on('connection_close', finish);
      conn.on('disconnected', finish);
      conn.close();
      setTimeout(finish, 1000);
    } else {
      finish();
    }
  }

  // hooks
  makeLink() { throw new Error('not implemented'); }
  bindLink() {}
  attachedHook() {}
  lostHook() {}
  stopHook() {}
}

function dropConnection(conn) {
  try { if (conn.is_open && conn.is_open()) conn.close(); } catch (e) { /* being thrown away */ }
  const socket = conn.socket;
  if (socket) setTimeout(() => { try { socket.destroy(); } catch (e) { /* gone */ } }, 200);
}

// ------------------------------------------------------------------------------------------- publisher

// Messages go out in send() order as the router's credit allows; each is journaled with its tag before its
// transfer leaves. onOutcome({state, tag, seq, condition, resent}) is called for every outcome, including those
// of deliveries resent after a process restart.
class ResumablePublisher extends ResumableClient {
  constructor(o) {
    const state = new PublisherState(o.state_path, { container_id: o.container_id, link_name: o.link_name, topic: o.topic });
    super(o, 'publisher', state);
    this.pending = []; // [{message, seq}] not yet sent
    this.resend = []; // hex tags to resend, in order
    this.resentTags = new Set();
    this.resentCount = 0;
    this.onOutcome = o.on_outcome || null;
  }

  get incarnation() { return this.state.incarnation; }
  get unsettledCount() { return this.state.unsettled.size; }
  idle() { return this.pending.length === 0 && this.resend.length === 0 && this.state.unsettled.size === 0; }

  send(message, seq) {
    if (this.error) throw this.error;
    if (this.stopping) throw new ClientError('publisher is closed');
    this.pending.push({ message, seq });
    if (this.attached) this.pump();
  }

  incarnationToPresent() { return this.state.incarnation; }

  makeLink(conn, props) {
    // rcv-settle-mode second: the router keeps its subscribers' copies unsettled until we settled, so that a router
    // dying between the two cannot leave a subscriber that forgot a delivery we still resend. A router may answer first.
    const opts = { name: this.linkName, target: { address: this.topic }, source: {}, snd_settle_mode: 0, rcv_settle_mode: 1,
                   autosettle: false, treat_modified_as_released: false };
    if (props) opts.properties = props;
    return conn.open_sender(opts);
  }

  bindLink(link, live) {
    link.on('sendable', live(() => { if (this.attached) this.pump(); }));
    const update = live((ctx) => this.onUpdate(ctx.delivery));
    for (const name of ['accepted', 'rejected', 'released', 'modified', 'settled']) link.on(name, update);
  }

  attachedHook(link, answer, resumed) {
    if (answer.incarnation && answer.incarnation !== this.state.incarnation) {
      // Only a stream-id collision makes a router refuse our incarnation: our old tags then name another stream,
      // and resending them makes new deliveries (at-least-once for those).
      if (this.state.incarnation !== null) this.note('incarnation-changed', `${this.state.incarnation} -> ${answer.incarnation}`);
      this.state.recordIncarnation(answer.incarnation);
    } else if (!answer.incarnation) {
      this.note('no-incarnation', "router's attach carried no eorouter:incarnation");
    }
    // resend everything unsettled, original tag and bytes, in order, before anything new (whatever the answer)
    this.resend = Array.from(this.state.unsettled.keys());
    if (resumed) {
      this.ledger.write('resumed', { router: this.router, incarnation: this.state.incarnation,
        unsettled: this.state.unsettled.size, reported: this.lastResume.reported.length,
        incomplete: this.lastResume.incomplete, known: answer.unsettled ? answer.unsettled.size : null,
        resend: this.resend.length });
    }
    this.pump();
  }

  // Credit the router gave that no transfer queued in rhea uses yet (rhea queues a send() without credit and
  // only takes the credit when the transfer goes out, on the next tick).
  room() {
    const link = this.link;
    if (!link || !this.attached) return 0;
    const out = link.session.outgoing;
    const queued = out.next_delivery_id - out.next_pending_delivery;
    return Math.min(link.credit - queued, out.available());
  }

  pump() {
    let room = this.room();
    while (room > 0) {
      if (this.resend.length) {
        const hex = this.resend.shift();
        const entry = this.state.unsettled.get(hex);
        if (!entry) continue;
        this.transfer(entry.tag, entry.payload);
        this.resentTags.add(hex);
        this.resentCount += 1;
        const m = rhea.message.decode(entry.payload);
        this.ledger.write('sent', { pub_tag: hex, seq: entry.seq, router: this.router, incarnation: this.state.incarnation,
          digest: bodyDigest(m.body), message_id: messageIdOf(m), size: bodySize(m.body), resend: true });
      } else if (this.pending.length) {
        const p = this.pending.shift();
        const seq = p.seq !== undefined && p.seq !== null ? p.seq : this.state.nextSeq;
        const message = Object.assign({}, p.message);
        message.application_properties = Object.assign({}, message.application_properties || {}, { seq });
        const payload = rhea.message.encode(message);
        const tag = this.state.recordSent(payload, seq); // journaled before the transfer leaves
        this.transfer(tag, payload);
        this.ledger.write('sent', { pub_tag: tag.toString('hex'), seq, router: this.router, incarnation: this.state.incarnation,
          digest: bodyDigest(message.body), message_id: messageIdOf(message), size: bodySize(message.body) });
      } else {
        break;
      }
      room -= 1;
    }
    this.changed();
  }

  transfer(tag, payload) {
    this.link.send(payload, tag, 0); // format 0 given: rhea sends the bytes as they are
  }

  onUpdate(d) {
    if (d.eoroHandled) return;
    let state = outcomeName(d.remote_state);
    if (state === null && !d.remote_settled) return; // not terminal yet
    if (state === null) state = 'released'; // settled without an outcome
    d.eoroHandled = true;
    const tag = Buffer.from(d.tag);
    const hex = tag.toString('hex');
    const entry = this.state.unsettled.get(hex);
    d.update(true); // settle: the delivery is done for us
    // With rcv-settle-mode second the router does not settle a publisher's delivery itself (it waits for ours); rhea drops a sent delivery from
    // its session buffer only once both sides settled, and stops being sendable when that buffer (2048) is
    // full. We settled, the router has nothing more to say about it: let rhea forget it.
    d.remote_settled = true;
    if (!entry) return;
    const err = d.remote_state && d.remote_state.error;
    const outcome = { state, tag, seq: entry.seq, condition: err && err.condition ? String(err.condition) : null,
                      description: err && err.description ? String(err.description) : null, resent: this.resentTags.has(hex) };
    this.state.recordSettled(hex);
    this.resentTags.delete(hex);
    this.ledger.write('outcome', { pub_tag: hex, seq: entry.seq, outcome: state, router: this.router,
      incarnation: this.state.incarnation, condition: outcome.condition });
    if (this.onOutcome) this.onOutcome(outcome);
    this.pump();
  }

  lostHook() { this.resend = []; }
}

function bodySize(body) {
  if (typeof body === 'string' || Buffer.isBuffer(body)) return body.length;
  return null;
}

// ------------------------------------------------------------------------------------------- subscriber

// A durable subscription (source durability unsettled-state, expiry never) with rcv-settle-mode=second.
// onMessage({message, tag, seq, router}) returns null/undefined (accepted) or "rejected"/"released"/"modified";
// it is called once per delivery tag, ever (the state file's dedup set).
class ResumableSubscriber extends ResumableClient {
  constructor(o) {
    const state = new SubscriberState(o.state_path, { container_id: o.container_id, link_name: o.link_name, topic: o.topic },
                                      o.dedup_window, o.dedup_linger);
    super(o, 'subscriber', state);
    this.onMessage = o.on_message || null;
    this.prefetch = o.prefetch === undefined ? 100 : o.prefetch;
    this.terminusTimeout = o.terminus_timeout || 0;
    this.delivered = 0;
    this.duplicates = 0;
    this.appErrors = 0;
  }

  get unsettledCount() { return this.state.unsettled.size; }

  makeLink(conn, props) {
    const opts = { name: this.linkName,
                   source: { address: this.topic, durable: 2, expiry_policy: 'never', timeout: this.terminusTimeout },
                   target: {}, snd_settle_mode: 0, rcv_settle_mode: 1, autoaccept: false, autosettle: true,
                   credit_window: this.prefetch };
    if (props) opts.properties = props;
    return conn.open_receiver(opts);
  }

  bindLink(link, live) {
    link.on('message', live((ctx) => this.onDelivery(ctx)));
    link.on('settled', live((ctx) => { // the router settled: forget it (it stays in the dedup set)
      const d = ctx.delivery;
      d.settled = true;
      this.state.recordSettled(Buffer.from(d.tag).toString('hex'));
      this.changed();
    }));
  }

  attachedHook(link, answer, resumed) {
    if (!resumed) return;
    const reported = this.lastResume.reported;
    // a reported tag missing from the router's answer is one it knows settled; a router that sends no
    // eorouter:unsettled at all does not speak the protocol and will never settle them on this link
    const settled = reported.map(([t]) => t.toString('hex')).filter((hex) => answer.unsettled === null || !answer.unsettled.has(hex));
    for (const hex of settled) this.state.recordSettled(hex);
    this.state.trim();
    this.ledger.write('resumed', { router: this.router, unsettled: this.state.unsettled.size + settled.length,
      reported: reported.length, incomplete: this.lastResume.incomplete,
      known: answer.unsettled ? answer.unsettled.size : null, settled: settled.length });
  }

  onDelivery(ctx) {
    const d = ctx.delivery;
    const tag = Buffer.from(d.tag);
    const hex = tag.toString('hex');
    const known = this.state.seen(hex);
    if (known !== null) {
      // resent after a resume: answer as before, do not hand it over again
      this.duplicates += 1;
      this.answer(d, hex, known, false);
      this.changed();
      return;
    }
    if (ctx.format !== undefined && ctx.format !== 0) { this.answer(d, hex, 'rejected', true); return; }
    const message = ctx.message;
    const props = message.application_properties || {};
    const seq = props.seq === undefined || props.seq === null ? null : Number(props.seq);
    let state = 'accepted';
    try {
      const r = this.onMessage ? this.onMessage({ message, tag, seq, router: this.router }) : null;
      if (r !== null && r !== undefined) {
        if (!TERMINAL.has(r)) throw new Error(`on_message returned ${r}`);
        state = r;
      }
    } catch (e) { // an application failure is released, never handed over again
      this.appErrors += 1;
      this.note('application-error', `${hex}: ${e.message}`);
      state = 'released';
    }
    this.delivered += 1;
    const pubTag = inlinePubTag(hex);
    this.ledger.write('delivered', { delivery: hex, pub_tag: pubTag, seq, outcome: state, router: this.router,
      digest: bodyDigest(message.body), message_id: messageIdOf(message), size: bodySize(message.body) });
    this.answer(d, hex, state, true);
    this.changed();
  }

  answer(d, hex, state, record) {
    const arrivedSettled = Boolean(d.remote_settled);
    if (record) this.state.recordDelivered(hex, state, arrivedSettled);
    if (arrivedSettled) { d.update(true, outcomeState(state)); this.state.recordSettled(hex); return; }
    d.update(undefined, outcomeState(state)); // rcv-settle-mode=second: our answer unsettled
  }
}

module.exports = {
  ResumablePublisher, ResumableSubscriber, ClientError, StateError, PublisherState, SubscriberState, Ledger,
  resumeProperties, readAnswer, cutUnsettled, unsettledBudget, failoverUrls, mergeUrls, normaliseUrl, Backoff,
  RESUME, INCARNATION, UNSETTLED, INCOMPLETE,
};

// ------------------------------------------------------------------------------------------- command line

// HOST PORT TOPIC COUNT --ledger PATH --state PATH [--url HOST:PORT]... [options]: the existing rhea peers'
// positional arguments; --url adds routers to the configured failover list (after HOST:PORT).
function parseArgs(role) {
  const short = role === 'publisher' ? 'pub' : 'sub';
  const a = { role, urls: [], heartbeat: 2, timeout: 120, verbose: false, connect_timeout: 5,
              size: 32, window: 100, rate: 0, prefetch: 100, idle_exit: 0, terminus_timeout: 0, delay_ms: 0 };
  const numeric = ['heartbeat', 'timeout', 'connect_timeout', 'size', 'window', 'rate', 'prefetch', 'idle_exit', 'terminus_timeout', 'delay_ms'];
  const allowed = ['ledger', 'state', 'url', 'container_id', 'link', 'heartbeat', 'timeout', 'connect_timeout', 'verbose']
    .concat(role === 'publisher' ? ['size', 'window', 'rate'] : ['prefetch', 'idle_exit', 'terminus_timeout', 'delay_ms']);
  const usage = () => {
    const extra = role === 'publisher' ? '[--size N] [--window N] [--rate MSG_PER_S]'
      : '[--prefetch N] [--idle-exit S] [--terminus-timeout S] [--delay-ms MS]';
    process.stderr.write(`usage: resumable-${role}.js HOST PORT TOPIC COUNT --ledger PATH --state PATH [--url HOST:PORT]... ` +
      `[--container-id ID] [--link NAME] ${extra} [--heartbeat S] [--connect-timeout S] [--timeout S] [--verbose]\n`);
    process.exit(2);
  };
  const positional = [];
  const argv = process.argv.slice(2);
  for (let i = 0; i < argv.length; i++) {
    if (!argv[i].startsWith('--')) { positional.push(argv[i]); continue; }
    const key = argv[i].slice(2).replace(/-/g, '_');
    if (!allowed.includes(key)) usage();
    if (key === 'verbose') { a.verbose = true; continue; }
    const value = argv[++i];
    if (value === undefined) usage();
    if (key === 'url') a.urls.push(value);
    else if (numeric.includes(key)) { a[key] = Number(value); if (Number.isNaN(a[key])) usage(); }
    else a[key] = value;
  }
  if (positional.length !== 4 || !a.ledger || !a.state) usage();
  a.topic = positional[2];
  a.count = Number(positional[3]);
  a.urls.unshift(`${positional[0]}:${positional[1]}`);
  if (!a.container_id && fs.existsSync(a.state)) { // a restart: the identity is in the state file
    try {
      const snap = JSON.parse(fs.readFileSync(a.state, 'utf8'));
      a.container_id = snap.container_id;
      a.link = a.link || snap.link_name;
    } catch (e) { /* the client reports the unreadable file */ }
  }
  a.container_id = a.container_id || `rhea-r${short}-${process.pid}`;
  a.link = a.link || `${a.container_id}-${short}`;
  return a;
}

module.exports.parseArgs = parseArgs;
