"""A Python client generated from kvd's proto/ with grpcio-tools, against a running kvd.

Run by crates/kvd/tests/python_client.rs, which generates the code into GEN_DIR and passes
the endpoint in KVD_ENDPOINT (and, for mutual TLS, the PEM files in KVD_CACERT, KVD_CERT and
KVD_KEY). Exercises KV, Watch and Lease; exits non-zero on any failure.
"""
import os
import queue
import sys
import threading

sys.path.insert(0, os.environ["GEN_DIR"])

import grpc  # noqa: E402
from etcd.api.etcdserverpb import rpc_pb2 as pb  # noqa: E402
from etcd.api.etcdserverpb import rpc_pb2_grpc as svc  # noqa: E402
from etcd.api.mvccpb import kv_pb2  # noqa: E402


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def channel():
    endpoint = os.environ["KVD_ENDPOINT"]
    ca = os.environ.get("KVD_CACERT")
    if not ca:
        return grpc.insecure_channel(endpoint)

    def read(var):
        with open(os.environ[var], "rb") as f:
            return f.read()

    creds = grpc.ssl_channel_credentials(
        root_certificates=read("KVD_CACERT"),
        private_key=read("KVD_KEY"),
        certificate_chain=read("KVD_CERT"),
    )
    return grpc.secure_channel(endpoint, creds)


def main():
    ch = channel()
    grpc.channel_ready_future(ch).result(timeout=10)
    kv, watch, lease = svc.KVStub(ch), svc.WatchStub(ch), svc.LeaseStub(ch)

    # KV: put, range, txn, delete, and etcd's errors.
    put = kv.Put(pb.PutRequest(key=b"py/a", value=b"1"))
    check(put.header.revision > 1 and put.header.cluster_id != 0, f"put header {put.header}")
    kv.Put(pb.PutRequest(key=b"py/b", value=b"2"))
    r = kv.Range(pb.RangeRequest(key=b"py/", range_end=b"py0"))
    check([x.key for x in r.kvs] == [b"py/a", b"py/b"] and r.count == 2, f"range {r}")
    t = kv.Txn(pb.TxnRequest(
        compare=[pb.Compare(key=b"py/a", target=pb.Compare.VALUE, result=pb.Compare.EQUAL, value=b"1")],
        success=[pb.RequestOp(request_put=pb.PutRequest(key=b"py/a", value=b"3"))],
        failure=[]))
    check(t.succeeded, "txn did not succeed")
    d = kv.DeleteRange(pb.DeleteRangeRequest(key=b"py/b", prev_kv=True))
    check(d.deleted == 1 and d.prev_kvs[0].value == b"2", f"delete {d}")
    try:
        kv.Put(pb.PutRequest(key=b"", value=b"x"))
        check(False, "an empty key was accepted")
    except grpc.RpcError as e:
        check(e.code() == grpc.StatusCode.INVALID_ARGUMENT, f"code {e.code()}")
        check(e.details() == "etcdserver: key is not provided", f"details {e.details()}")

    # Watch: a bidi stream; create, then a put and a delete arrive as events.
    requests = queue.Queue()
    requests.put(pb.WatchRequest(create_request=pb.WatchCreateRequest(key=b"py/w", prev_kv=True)))

    def reqs():
        while True:
            item = requests.get()
            if item is None:
                return
            yield item

    responses = watch.Watch(reqs())
    first = next(responses)
    check(first.created, f"watch not created: {first}")
    events = []

    def writer():
        kv.Put(pb.PutRequest(key=b"py/w", value=b"v1"))
        kv.DeleteRange(pb.DeleteRangeRequest(key=b"py/w"))

    threading.Thread(target=writer).start()
    for resp in responses:
        events.extend(resp.events)
        if len(events) >= 2:
            break
    check(events[0].type == kv_pb2.Event.PUT and events[0].kv.value == b"v1", f"events {events}")
    check(events[1].type == kv_pb2.Event.DELETE and events[1].prev_kv.value == b"v1", f"events {events}")
    requests.put(None)
    responses.cancel()

    # Lease: grant, attach, keep alive, time to live, revoke (the key goes with it).
    g = lease.LeaseGrant(pb.LeaseGrantRequest(TTL=30))
    check(g.ID != 0 and g.TTL == 30, f"grant {g}")
    kv.Put(pb.PutRequest(key=b"py/l", value=b"v", lease=g.ID))
    ka = next(lease.LeaseKeepAlive(iter([pb.LeaseKeepAliveRequest(ID=g.ID)])))
    check(ka.ID == g.ID and ka.TTL == 30, f"keepalive {ka}")
    ttl = lease.LeaseTimeToLive(pb.LeaseTimeToLiveRequest(ID=g.ID, keys=True))
    check(ttl.grantedTTL == 30 and list(ttl.keys) == [b"py/l"], f"timetolive {ttl}")
    lease.LeaseRevoke(pb.LeaseRevokeRequest(ID=g.ID))
    check(kv.Range(pb.RangeRequest(key=b"py/l")).count == 0, "the leased key outlived its lease")
    print("python client: KV, Watch and Lease OK")


if __name__ == "__main__":
    main()
