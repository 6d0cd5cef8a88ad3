'use strict';
// eorouter interop peers on rhea: the shared command line, message shape and ledger.
// The contract (options, message, ledger fields) is described in interop/clientkit.py.
const fs = require('fs');
const { blake2b } = require('./blake2b');

function usage(role) {
  const extra = role === 'publisher'
    ? '[--size N] [--settle on-outcome|default|presettled]'
    : '[--outcome accept|reject|release|modify|hold] [--rcv-settle-mode first|second] ' +
      '[--snd-settle-mode unsettled|settled] [--credit N] [--linger S]';
  process.stderr.write(`usage: ${role}.js HOST PORT TOPIC COUNT --ledger PATH [--container-id ID] [--link NAME] ` +
                       `${extra} [--disconnect-after K] [--timeout S]\n` +
                       '       [--tls-ca PATH] [--tls-cert PATH --tls-key PATH] [--user NAME --password PW] ' +
                       '[--mech MECHS]\n');
  process.exit(2);
}

function usageError(role, why) {
  process.stderr.write(`${role}.js: ${why}\n`);
  usage(role);
}

// An option this stack cannot do: the usage error's status (2), the reason on stderr and in the summary.
function unsupported(role, what) {
  process.stderr.write(`${role}.js: ${what}: not supported by this stack\n`);
  process.stdout.write(JSON.stringify({ stack: 'rhea', role, error: `${what}: not supported by this stack` }) + '\n');
  process.exit(2);
}

const SECURITY = ['tls_ca', 'tls_cert', 'tls_key', 'user', 'password', 'mech'];

function parse(role) {
  const a = { role, size: 32, settle: 'on-outcome', outcome: 'accept', rcv_settle_mode: 'first',
              snd_settle_mode: 'unsettled', credit: 100, linger: 0, disconnect_after: 0, timeout: 20 };
  const positional = [];
  const argv = process.argv.slice(2);
  const choices = { settle: ['on-outcome', 'default', 'presettled'],
                    outcome: ['accept', 'reject', 'release', 'modify', 'hold'],
                    rcv_settle_mode: ['first', 'second'], snd_settle_mode: ['unsettled', 'settled'] };
  const numeric = ['size', 'credit', 'linger', 'disconnect_after', 'timeout'];
  const allowed = (role === 'publisher'
    ? ['ledger', 'container_id', 'link', 'size', 'settle', 'disconnect_after', 'timeout']
    : ['ledger', 'container_id', 'link', 'outcome', 'rcv_settle_mode', 'snd_settle_mode', 'credit',
       'disconnect_after', 'linger', 'timeout', 'selector']).concat(SECURITY);
  for (let i = 0; i < argv.length; i++) {
    if (argv[i].startsWith('--')) {
      const key = argv[i].slice(2).replace(/-/g, '_');
      const value = argv[++i];
      if (!allowed.includes(key) || value === undefined) usage(role);
      if (choices[key] && !choices[key].includes(value)) usage(role);
      a[key] = numeric.includes(key) ? Number(value) : value;
    } else {
      positional.push(argv[i]);
    }
  }
  if (positional.length !== 4 || !a.ledger) usage(role);
  // the security options together (as interop/clientkit.py's security_problem)
  if ((a.tls_cert === undefined) !== (a.tls_key === undefined)) usageError(role, '--tls-cert and --tls-key go together');
  if (a.tls_cert !== undefined && a.tls_ca === undefined) usageError(role, 'a client certificate (--tls-cert) needs TLS (--tls-ca)');
  if (a.password !== undefined && a.user === undefined) usageError(role, '--password needs --user');
  if (a.mech !== undefined && !a.mech.trim()) usageError(role, '--mech needs at least one mechanism');
  [a.host, a.port, a.topic, a.count] = [positional[0], Number(positional[1]), positional[2], Number(positional[3])];
  const short = role === 'publisher' ? 'pub' : 'sub';
  a.container_id = a.container_id || `rhea-${short}-${process.pid}`;
  a.link = a.link || `${a.container_id}-${short}`;
  return a;
}

// rhea's connect options for the common command line: TLS (node's tls.connect: the server's certificate
// checked against the CA and against HOST as servername), a client certificate, a SASL login. rhea's
// client SASL knows PLAIN (username + password), EXTERNAL (a client certificate, with
// enable_sasl_external), ANONYMOUS and XOAUTH2; nothing else (no SCRAM).
function connectOptions(a) {
  const o = { host: a.host, port: a.port, reconnect: false };
  if (a.tls_ca !== undefined) {
    Object.assign(o, { transport: 'tls', ca: [fs.readFileSync(a.tls_ca)], servername: a.host, rejectUnauthorized: true });
    if (a.tls_cert !== undefined) {
      o.cert = fs.readFileSync(a.tls_cert);
      o.key = fs.readFileSync(a.tls_key);
      o.enable_sasl_external = true; // offer EXTERNAL when the server does
    }
  }
  if (a.user !== undefined) o.username = a.user;
  if (a.password !== undefined) o.password = a.password;
  if (a.mech !== undefined) {
    const sasl = require('rhea').sasl;
    const mechs = sasl.client_mechanisms();
    for (const name of a.mech.trim().split(/\s+/)) {
      const upper = name.toUpperCase();
      if (upper === 'PLAIN') {
        if (a.user === undefined || a.password === undefined) usageError(a.role, 'PLAIN needs --user and --password');
        mechs.enable_plain(a.user, a.password);
      } else if (upper === 'EXTERNAL') {
        if (a.tls_cert === undefined) usageError(a.role, 'EXTERNAL needs a client certificate (--tls-cert)');
        mechs.enable_external();
      } else if (upper === 'ANONYMOUS') {
        mechs.enable_anonymous(a.user || 'anonymous');
      } else {
        unsupported(a.role, `SASL mechanism ${name} (rhea's client has PLAIN, EXTERNAL, ANONYMOUS)`);
      }
    }
    o.sasl_mechanisms = mechs; // exactly these, whatever else username/password would enable
    delete o.enable_sasl_external;
  }
  return o;
}

// A connection-level error (a refused login, a failed TLS handshake, the router's close) as text.
function errorText(error) {
  if (!error) return '';
  const condition = error.condition || error.code;
  const description = error.description || error.message || '';
  return condition ? `${condition}: ${description}` : String(description || error);
}

function now() {
  // The wall clock, as the other stacks' ledgers read it. Not performance.timeOrigin +
  // performance.now(): node's timeOrigin was measured a few ms off the system clock here
  // (3.4 ms), enough to misorder events against another process's ledger.
  return Date.now() / 1000;
}

class Ledger { // docs/ledger.md: the standard fields in order, then extras
  constructor(a) {
    this.a = a;
    this.router = `${a.host}:${a.port}`;
    this.incarnation = null;
    this.fd = fs.openSync(a.ledger, 'a');
  }
  write(event, fields) {
    const f = Object.assign({ delivery: null, pub_tag: null, seq: null, outcome: null, digest: null }, fields);
    if (f.pub_tag === null && event === 'delivered') f.pub_tag = inlinePubTag(f.delivery);
    const line = { ts: now(), client: this.a.container_id, link: this.a.link, role: this.a.role, event,
                   topic: this.a.topic, delivery: f.delivery, pub_tag: f.pub_tag, seq: f.seq, outcome: f.outcome,
                   router: this.router, incarnation: this.a.role === 'publisher' ? this.incarnation : null,
                   digest: f.digest, message_id: null };
    for (const [k, v] of Object.entries(fields)) if (!(k in line)) line[k] = v;
    fs.writeSync(this.fd, JSON.stringify(line) + '\n'); // synchronous: survives process.exit()
  }
}

// The publisher's own tag inside the router's disambiguated tag (docs/tags.md), when inline: hex or null.
function inlinePubTag(deliveryHex) {
  if (!deliveryHex) return null;
  const t = Buffer.from(deliveryHex, 'hex');
  if (t.length >= 17 && t[16] <= 15 && t.length === 17 + t[16]) return t.subarray(17).toString('hex');
  return null;
}

// BLAKE2b-128 (hex) of Message(body=<string>).encode() as python-qpid-proton writes it: empty header and
// properties lists, then the amqp-value section (docs/ledger.md).
function digest(body) {
  const data = Buffer.isBuffer(body) ? body : Buffer.from(String(body), 'utf8');
  const head = Buffer.from('0053704500537345005377', 'hex');
  let size;
  if (data.length <= 255) size = Buffer.from([0xa1, data.length]);
  else { size = Buffer.alloc(5); size[0] = 0xb1; size.writeUInt32BE(data.length, 1); }
  return blake2b(Buffer.concat([head, size, data]), 16).toString('hex');
}

function incarnationOf(properties) {
  if (!properties) return null;
  const v = properties['eorouter:incarnation'];
  return v === undefined || v === null ? null : String(v);
}

function body(topic, seq, size) {
  const head = `${topic}#${seq}:`;
  return head + 'x'.repeat(Math.max(0, size - head.length));
}

function hex(tag) {
  if (tag === undefined || tag === null) return null;
  return Buffer.from(tag).toString('hex');
}

function seqOf(message) {
  const props = message.application_properties || {};
  if (props.seq !== undefined) return Number(props.seq);
  const b = typeof message.body === 'string' ? message.body : '';
  const m = /#(\d+):/.exec(b);
  return m ? Number(m[1]) : null;
}

module.exports = { parse, connectOptions, errorText, now, Ledger, body, hex, seqOf, digest, incarnationOf, inlinePubTag };
