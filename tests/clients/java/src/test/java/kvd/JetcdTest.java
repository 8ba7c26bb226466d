package kvd;

import static java.nio.charset.StandardCharsets.UTF_8;
import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.etcd.jetcd.ByteSequence;
import io.etcd.jetcd.Client;
import io.etcd.jetcd.KV;
import io.etcd.jetcd.KeyValue;
import io.etcd.jetcd.Watch;
import io.etcd.jetcd.election.LeaderKey;
import io.etcd.jetcd.kv.PutResponse;
import io.etcd.jetcd.op.Cmp;
import io.etcd.jetcd.op.CmpTarget;
import io.etcd.jetcd.op.Op;
import io.etcd.jetcd.options.DeleteOption;
import io.etcd.jetcd.options.GetOption;
import io.etcd.jetcd.options.LeaseOption;
import io.etcd.jetcd.options.PutOption;
import io.etcd.jetcd.options.WatchOption;
import io.etcd.jetcd.watch.WatchEvent;
import io.grpc.Status;
import java.io.File;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashSet;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.stream.Stream;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.Arguments;
import org.junit.jupiter.params.provider.MethodSource;

/**
 * jetcd, Java's etcd client (Vert.x gRPC over Netty's HTTP/2), against every server named in
 * the system property {@code endpoints} ({@code name=http://host:port,...}: kvd and etcd, so
 * that each expectation here is also checked to be etcd's, in the clear and over mutual TLS
 * at https:// endpoints). Each test uses keys of its own under the server's name.
 */
class JetcdTest {
  static final long T = 20; // seconds

  static Stream<Arguments> servers() {
    String all = System.getProperty("endpoints", "");
    assertFalse(all.isBlank(), "no -Dendpoints given");
    return Arrays.stream(all.split(",")).map(s -> s.split("=", 2)).map(p -> Arguments.of(p[0], p[1]));
  }

  static ByteSequence bs(String s) {
    return ByteSequence.from(s, UTF_8);
  }

  static <V> V get(CompletableFuture<V> f) throws Exception {
    return f.get(T, TimeUnit.SECONDS);
  }

  /** The gRPC status (code and message) that fails {@code f}. */
  static Status failure(CompletableFuture<?> f) {
    ExecutionException e = assertThrows(ExecutionException.class, () -> f.get(T, TimeUnit.SECONDS));
    Status s = Status.fromThrowable(e.getCause());
    assertNotEquals(Status.Code.UNKNOWN, s.getCode(), () -> "not a gRPC status: " + e);
    return s;
  }

  static void assertStatus(Status.Code code, String message, Status got) {
    assertEquals(code, got.getCode(), got::toString);
    assertEquals(message, got.getDescription());
  }

  /** A client of {@code endpoint}; an https one over mutual TLS with the -Dtls.* files. */
  static Client client(String endpoint) throws Exception {
    var b = Client.builder().endpoints(endpoint);
    if (endpoint.startsWith("https://")) {
      File ca = new File(System.getProperty("tls.cacert"));
      File cert = new File(System.getProperty("tls.cert"));
      File key = new File(System.getProperty("tls.key"));
      b = b.sslContext(ssl -> ssl.trustManager(ca).keyManager(cert, key));
    }
    return b.build();
  }

  @ParameterizedTest(name = "{0}")
  @MethodSource("servers")
  void kvTxnAndEtcdsErrors(String name, String endpoint) throws Exception {
    try (Client c = client(endpoint)) {
      KV kv = c.getKVClient();
      String p = name + "/kv/";
      PutResponse put = get(kv.put(bs(p + "a"), bs("1")));
      assertTrue(put.getHeader().getRevision() > 1);
      assertNotEquals(0, put.getHeader().getClusterId());
      assertNotEquals(0, put.getHeader().getMemberId());
      get(kv.put(bs(p + "b"), bs("2")));
      List<KeyValue> kvs = get(kv.get(bs(p), GetOption.builder().isPrefix(true).build())).getKvs();
      assertEquals(List.of(p + "a", p + "b"), kvs.stream().map(x -> x.getKey().toString(UTF_8)).toList());

      var txn = get(kv.txn()
          .If(new Cmp(bs(p + "a"), Cmp.Op.EQUAL, CmpTarget.value(bs("1"))))
          .Then(Op.put(bs(p + "a"), bs("3"), PutOption.DEFAULT), Op.get(bs(p + "b"), GetOption.DEFAULT))
          .Else(Op.delete(bs(p + "a"), DeleteOption.DEFAULT))
          .commit());
      assertTrue(txn.isSucceeded());
      assertEquals("2", txn.getGetResponses().get(0).getKvs().get(0).getValue().toString(UTF_8));
      var del = get(kv.delete(bs(p + "b"), DeleteOption.builder().withPrevKV(true).build()));
      assertEquals(1, del.getDeleted());
      assertEquals("2", del.getPrevKvs().get(0).getValue().toString(UTF_8));

      assertStatus(Status.Code.INVALID_ARGUMENT, "etcdserver: key is not provided",
          failure(kv.put(ByteSequence.EMPTY, bs("x"))));
      assertStatus(Status.Code.OUT_OF_RANGE, "etcdserver: mvcc: required revision is a future revision",
          failure(kv.get(bs(p + "a"), GetOption.builder().withRevision(1_000_000_000L).build())));
      long rev = get(kv.put(bs(p + "c"), bs("x"))).getHeader().getRevision();
      get(kv.compact(rev - 1));
      assertStatus(Status.Code.OUT_OF_RANGE, "etcdserver: mvcc: required revision has been compacted",
          failure(kv.get(bs(p + "a"), GetOption.builder().withRevision(rev - 2).build())));
    }
  }

  @ParameterizedTest(name = "{0}")
  @MethodSource("servers")
  void bigValuesAndManyCallsAtOnce(String name, String endpoint) throws Exception {
    try (Client c = client(endpoint)) {
      KV kv = c.getKVClient();
      byte[] big = new byte[1 << 20];
      for (int i = 0; i < big.length; i++) {
        big[i] = (byte) (i * 31);
      }
      get(kv.put(bs(name + "/big"), ByteSequence.from(big)));
      assertArrayEquals(big, get(kv.get(bs(name + "/big"))).getKvs().get(0).getValue().getBytes());

      byte[] val = new byte[6000];
      Arrays.fill(val, (byte) 1);
      List<CompletableFuture<PutResponse>> puts = new ArrayList<>();
      for (int i = 0; i < 200; i++) {
        puts.add(kv.put(bs(String.format("%s/many/%03d", name, i)), ByteSequence.from(val)));
      }
      var revisions = new HashSet<Long>();
      for (var f : puts) {
        revisions.add(get(f).getHeader().getRevision());
      }
      assertEquals(200, revisions.size(), "two puts got one revision");
      var many = get(kv.get(bs(name + "/many/"), GetOption.builder().isPrefix(true).build())).getKvs();
      assertEquals(200, many.size());
      for (int i = 0; i < 200; i++) {
        assertEquals(String.format("%s/many/%03d", name, i), many.get(i).getKey().toString(UTF_8));
        assertArrayEquals(val, many.get(i).getValue().getBytes());
      }
    }
  }

  @ParameterizedTest(name = "{0}")
  @MethodSource("servers")
  void watchSeesPutAndDeleteWithPrevKv(String name, String endpoint) throws Exception {
    try (Client c = client(endpoint)) {
      KV kv = c.getKVClient();
      ByteSequence key = bs(name + "/w");
      long rev = get(kv.get(key)).getHeader().getRevision();
      var events = new LinkedBlockingQueue<WatchEvent>();
      var errors = new LinkedBlockingQueue<Throwable>();
      WatchOption opt = WatchOption.builder().withRevision(rev + 1).withPrevKV(true).build();
      try (Watch.Watcher w = c.getWatchClient().watch(key, opt, r -> events.addAll(r.getEvents()), errors::add)) {
        get(kv.put(key, bs("v1")));
        get(kv.delete(key));
        WatchEvent put = events.poll(T, TimeUnit.SECONDS);
        WatchEvent del = events.poll(T, TimeUnit.SECONDS);
        assertTrue(errors.isEmpty(), () -> "watch failed: " + errors);
        assertNotNull(del, "events missing");
        assertEquals(WatchEvent.EventType.PUT, put.getEventType());
        assertEquals("v1", put.getKeyValue().getValue().toString(UTF_8));
        assertEquals(WatchEvent.EventType.DELETE, del.getEventType());
        assertEquals("v1", del.getPrevKV().getValue().toString(UTF_8));
      }
    }
  }

  @ParameterizedTest(name = "{0}")
  @MethodSource("servers")
  void leaseKeepAliveTimeToLiveAndRevoke(String name, String endpoint) throws Exception {
    try (Client c = client(endpoint)) {
      KV kv = c.getKVClient();
      var lease = c.getLeaseClient();
      long id = get(lease.grant(30)).getID();
      ByteSequence key = bs(name + "/leased");
      get(kv.put(key, bs("v"), PutOption.builder().withLeaseId(id).build()));
      assertEquals(30, get(lease.keepAliveOnce(id)).getTTL());
      var ttl = get(lease.timeToLive(id, LeaseOption.builder().withAttachedKeys().build()));
      assertEquals(30, ttl.getGrantedTTL());
      assertEquals(List.of(key), ttl.getKeys());
      get(lease.revoke(id));
      assertEquals(0, get(kv.get(key)).getCount(), "the leased key outlived its lease");
      assertStatus(Status.Code.NOT_FOUND, "etcdserver: requested lease not found", failure(lease.revoke(id)));
    }
  }

  @ParameterizedTest(name = "{0}")
  @MethodSource("servers")
  void lockExcludesAndElectionElects(String name, String endpoint) throws Exception {
    try (Client c = client(endpoint)) {
      var lease = c.getLeaseClient();
      long l1 = get(lease.grant(30)).getID();
      long l2 = get(lease.grant(30)).getID();
      ByteSequence lockName = bs(name + "/lock");
      ByteSequence held = get(c.getLockClient().lock(lockName, l1)).getKey();
      assertTrue(held.startsWith(bs(name + "/lock/")), held.toString(UTF_8));
      var second = c.getLockClient().lock(lockName, l2);
      assertThrows(TimeoutException.class, () -> second.get(500, TimeUnit.MILLISECONDS), "the lock was taken twice");
      get(c.getLockClient().unlock(held));
      assertNotEquals(held, get(second).getKey());

      var election = c.getElectionClient();
      ByteSequence ename = bs(name + "/election");
      LeaderKey leader = get(election.campaign(ename, l1, bs("first"))).getLeader();
      assertEquals("first", get(election.leader(ename)).getKv().getValue().toString(UTF_8));
      var next = election.campaign(ename, l2, bs("second"));
      assertThrows(TimeoutException.class, () -> next.get(500, TimeUnit.MILLISECONDS), "two leaders at once");
      get(election.resign(leader));
      get(next);
      assertEquals("second", get(election.leader(ename)).getKv().getValue().toString(UTF_8));
      get(lease.revoke(l1));
      get(lease.revoke(l2));
    }
  }
}
