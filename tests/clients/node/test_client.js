// A Node.js client (@grpc/grpc-js, whose HTTP/2 is Node's own nghttp2) loading kvd's proto/ at
// run time, against a running kvd.
//
// Run by crates/kvd/tests/node_client.rs, which installs the packages of package-lock.json and
// passes the proto directory in PROTO_DIR and the endpoint in KVD_ENDPOINT (and, for mutual TLS,
// the PEM files in KVD_CACERT, KVD_CERT and KVD_KEY). Exercises KV (with
// etcd's errors, messages over HTTP/2's default windows, many calls at once on one connection),
// Watch, Lease and a Snapshot stream; exits non-zero on any failure.
'use strict';

const assert = require('node:assert/strict');
const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const loader = require('@grpc/proto-loader');

const def = loader.loadSync(path.join(process.env.PROTO_DIR, 'etcd/api/etcdserverpb/rpc.proto'), {
  includeDirs: [process.env.PROTO_DIR],
  keepCase: true,
  longs: String,
  enums: String,
  defaults: true,
  oneofs: true,
});
const pb = grpc.loadPackageDefinition(def).etcdserverpb;
const endpoint = process.env.KVD_ENDPOINT;
// Mutual TLS when the harness gives the PEM files (KVD_CACERT, KVD_CERT, KVD_KEY).
const fs = require('node:fs');
const creds = process.env.KVD_CACERT
  ? grpc.credentials.createSsl(
      fs.readFileSync(process.env.KVD_CACERT),
      fs.readFileSync(process.env.KVD_KEY),
      fs.readFileSync(process.env.KVD_CERT))
  : grpc.credentials.createInsecure();
const kv = new pb.KV(endpoint, creds);
const watch = new pb.Watch(endpoint, creds);
const lease = new pb.Lease(endpoint, creds);
const maint = new pb.Maintenance(endpoint, creds);

const call = (client, method, req) =>
  new Promise((resolve, reject) =>
    client[method](req, (err, res) => (err ? reject(err) : resolve(res))));
const fails = async (p) => {
  try {
    await p;
  } catch (e) {
    return e;
  }
  assert.fail('the call succeeded');
};
const b = (s) => Buffer.from(s);

async function kvCalls() {
  const put = await call(kv, 'Put', { key: b('js/a'), value: b('1') });
  assert.ok(BigInt(put.header.revision) > 1n && put.header.cluster_id !== '0', `put header ${JSON.stringify(put.header)}`);
  await call(kv, 'Put', { key: b('js/b'), value: b('2') });
  const r = await call(kv, 'Range', { key: b('js/'), range_end: b('js0') });
  assert.deepEqual(r.kvs.map((x) => x.key.toString()), ['js/a', 'js/b']);
  assert.equal(r.count, '2');
  const t = await call(kv, 'Txn', {
    compare: [{ key: b('js/a'), target: 'VALUE', result: 'EQUAL', value: b('1') }],
    success: [{ request_put: { key: b('js/a'), value: b('3') } }],
    failure: [],
  });
  assert.ok(t.succeeded, 'txn did not succeed');
  const d = await call(kv, 'DeleteRange', { key: b('js/b'), prev_kv: true });
  assert.equal(d.deleted, '1');
  assert.equal(d.prev_kvs[0].value.toString(), '2');

  // etcd's errors, code and message.
  let e = await fails(call(kv, 'Put', { key: b(''), value: b('x') }));
  assert.equal(e.code, grpc.status.INVALID_ARGUMENT);
  assert.equal(e.details, 'etcdserver: key is not provided');
  e = await fails(call(kv, 'Range', { key: b('js/a'), revision: '1000000' }));
  assert.equal(e.code, grpc.status.OUT_OF_RANGE);
  assert.equal(e.details, 'etcdserver: mvcc: required revision is a future revision');
  // Over --max-request-bytes (1.5 MiB) but within the receive limit: etcd's own error.
  e = await fails(call(kv, 'Put', { key: b('js/big'), value: Buffer.alloc(1800 << 10, 7) }));
  assert.equal(e.code, grpc.status.INVALID_ARGUMENT);
  assert.equal(e.details, 'etcdserver: request is too large');

  // A value far over HTTP/2's default 64 KiB windows, both ways.
  const big = Buffer.alloc(1 << 20);
  for (let i = 0; i < big.length; i++) big[i] = (i * 31) & 0xff;
  await call(kv, 'Put', { key: b('js/big'), value: big });
  const got = await call(kv, 'Range', { key: b('js/big') });
  assert.ok(got.kvs[0].value.equals(big), 'the 1 MiB value came back changed');

  // Many calls at once on the one connection: 200 puts, then a 1.2 MB range of them.
  const val = Buffer.alloc(6000, 1);
  const puts = await Promise.all(
    Array.from({ length: 200 }, (_, i) =>
      call(kv, 'Put', { key: b(`js/many/${String(i).padStart(3, '0')}`), value: val })));
  assert.equal(new Set(puts.map((p) => p.header.revision)).size, 200, 'two puts got one revision');
  const many = await call(kv, 'Range', { key: b('js/many/'), range_end: b('js/many0') });
  assert.equal(many.kvs.length, 200);
  assert.ok(many.kvs.every((x, i) => x.key.toString() === `js/many/${String(i).padStart(3, '0')}` && x.value.equals(val)));
}

function watchCalls() {
  return new Promise((resolve, reject) => {
    const stream = watch.Watch();
    const events = [];
    let id;
    stream.on('error', (e) => {
      if (e.code !== grpc.status.CANCELLED) reject(e);
    });
    stream.on('data', (resp) => {
      try {
        if (resp.created) {
          id = resp.watch_id;
          call(kv, 'Put', { key: b('js/w'), value: b('v1') })
            .then(() => call(kv, 'DeleteRange', { key: b('js/w') }))
            .catch(reject);
          return;
        }
        if (resp.canceled) {
          assert.equal(resp.watch_id, id);
          stream.cancel();
          resolve();
          return;
        }
        events.push(...resp.events);
        if (events.length === 2) {
          assert.equal(events[0].type, 'PUT');
          assert.equal(events[0].kv.value.toString(), 'v1');
          assert.equal(events[1].type, 'DELETE');
          assert.equal(events[1].prev_kv.value.toString(), 'v1');
          stream.write({ cancel_request: { watch_id: id } });
        }
      } catch (e) {
        reject(e);
      }
    });
    stream.write({ create_request: { key: b('js/w'), prev_kv: true } });
  });
}

async function leaseCalls() {
  const g = await call(lease, 'LeaseGrant', { TTL: '30' });
  assert.ok(g.ID !== '0' && g.TTL === '30', `grant ${JSON.stringify(g)}`);
  await call(kv, 'Put', { key: b('js/l'), value: b('v'), lease: g.ID });
  const ka = await new Promise((resolve, reject) => {
    const s = lease.LeaseKeepAlive();
    s.on('data', (r) => {
      s.end();
      resolve(r);
    });
    s.on('error', reject);
    s.write({ ID: g.ID });
  });
  assert.equal(ka.ID, g.ID);
  assert.equal(ka.TTL, '30');
  const ttl = await call(lease, 'LeaseTimeToLive', { ID: g.ID, keys: true });
  assert.equal(ttl.grantedTTL, '30');
  assert.deepEqual(ttl.keys.map((k) => k.toString()), ['js/l']);
  await call(lease, 'LeaseRevoke', { ID: g.ID });
  assert.equal((await call(kv, 'Range', { key: b('js/l') })).count, '0', 'the leased key outlived its lease');
  const e = await fails(call(lease, 'LeaseRevoke', { ID: g.ID }));
  assert.equal(e.code, grpc.status.NOT_FOUND);
  assert.equal(e.details, 'etcdserver: requested lease not found');
}

function snapshot() {
  return new Promise((resolve, reject) => {
    let bytes = 0;
    let last;
    const s = maint.Snapshot({});
    s.on('data', (r) => {
      bytes += r.blob.length;
      last = r;
    });
    s.on('error', reject);
    s.on('end', () => {
      try {
        // The database holds the 1 MiB value and the 1.2 MB of puts.
        assert.ok(bytes > 2 << 20, `a snapshot of ${bytes} bytes`);
        assert.equal(last.remaining_bytes, '0');
        resolve();
      } catch (e) {
        reject(e);
      }
    });
  });
}

async function main() {
  await kvCalls();
  await watchCalls();
  await leaseCalls();
  await snapshot();
  console.log('node client: KV, Watch, Lease and Snapshot OK');
  for (const c of [kv, watch, lease, maint]) c.close();
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
