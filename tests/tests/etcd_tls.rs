//! Issue 14: a real etcd with TLS, client-certificate authentication and user
//! authentication (etcd's own flags; certificates from deploy/certs/make-dev-certs.sh, i.e.
//! openssl). A replica with the right CA, client certificate, user and password file works;
//! with a wrong or missing one it fails clearly, before it serves.

use std::path::{Path, PathBuf};
use std::time::Duration;

use berth_control_plane::registry::Registry;
use berth_control_plane::registry::etcd::{EtcdConfig, EtcdRegistry};
use berth_proto::auth::Secret;
use berth_proto::tls::{ClientTls, TlsFiles};
use berth_tests::berth::{BerthProcess, berth_binary};
use berth_tests::etcd::etcd_binary;
use berth_tests::process::{ManagedProcess, ProcessSpec, free_port};

const ROOT_PASSWORD: &str = "etcd-root-password-0123";
/// etcd's `--auth-token-ttl` in these tests.
const TOKEN_TTL: Duration = Duration::from_secs(1);

fn make_certs(dir: &Path) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/certs/make-dev-certs.sh");
    let output = std::process::Command::new("bash").arg(script).arg(dir).arg("etcd").output().expect("openssl");
    assert!(output.status.success(), "make-dev-certs.sh: {}", String::from_utf8_lossy(&output.stderr));
}

fn tls(certs: &Path, with_client_cert: bool) -> ClientTls {
    ClientTls {
        ca: certs.join("ca.pem"),
        identity: with_client_cert
            .then(|| TlsFiles { cert: certs.join("replica.pem"), key: certs.join("replica.key") }),
        domain: None,
    }
}

/// Starts etcd serving clients over TLS only, requiring client certificates from `certs`'s
/// CA, and turns on its user authentication (user root with [`ROOT_PASSWORD`]).
async fn start_etcd(certs: &Path) -> (ManagedProcess, String) {
    let client_port = free_port().unwrap();
    let peer_port = free_port().unwrap();
    let dir = tempfile::Builder::new().prefix("berth-etcd-tls-").tempdir().unwrap();
    let data: PathBuf = dir.path().join("data");
    let client = format!("https://127.0.0.1:{client_port}");
    let peer = format!("http://127.0.0.1:{peer_port}");
    let path = |name: &str| certs.join(name).display().to_string();
    let args = vec![
        "--name".to_owned(),
        "tls".into(),
        "--data-dir".into(),
        data.display().to_string(),
        "--listen-client-urls".into(),
        client.clone(),
        "--advertise-client-urls".into(),
        client.clone(),
        "--listen-peer-urls".into(),
        peer.clone(),
        "--initial-advertise-peer-urls".into(),
        peer.clone(),
        "--initial-cluster".into(),
        format!("tls={peer}"),
        "--cert-file".into(),
        path("etcd.pem"),
        "--key-file".into(),
        path("etcd.key"),
        "--trusted-ca-file".into(),
        path("ca.pem"),
        "--client-cert-auth".into(),
        // Short-lived tokens: replicas must authenticate again when theirs expire.
        format!("--auth-token-ttl={}", TOKEN_TTL.as_secs()),
    ];
    let spec = ProcessSpec {
        env_remove_prefixes: vec!["ETCD_".into()],
        ..ProcessSpec::new("etcd-tls", etcd_binary()).args(args)
    };
    let process = ManagedProcess::spawn_in(spec, dir).unwrap();
    // Enable authentication with etcd's own API, over the same TLS.
    let options = etcd_client::ConnectOptions::new()
        .with_tls(tls(certs, true).config().unwrap())
        .with_connect_timeout(Duration::from_secs(2));
    let mut admin = berth_testkit::eventually_ok("etcd serving TLS", Duration::from_secs(30), || {
        let (client, options) = (client.clone(), options.clone());
        async move {
            let mut admin = etcd_client::Client::connect([client], Some(options)).await?;
            admin.status().await?;
            Ok::<_, etcd_client::Error>(admin)
        }
    })
    .await;
    admin.user_add("root", ROOT_PASSWORD, None).await.expect("user add");
    admin.user_grant_role("root", "root").await.expect("grant root");
    admin.auth_enable().await.expect("auth enable");
    (process, client)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_reach_etcd_over_tls_with_auth_and_fail_clearly_without() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("pki");
    make_certs(&certs);
    let other = dir.path().join("other");
    make_certs(&other);
    let (etcd, endpoint) = start_etcd(&certs).await;
    let root = Some(("root".to_owned(), Secret::new(ROOT_PASSWORD)));
    let config = |tls: Option<ClientTls>, user: Option<(String, Secret)>| EtcdConfig {
        tls,
        user,
        ..EtcdConfig::new([endpoint.clone()])
    };

    // The right CA, client certificate and user: reads and writes work.
    let registry = EtcdRegistry::connect(config(Some(tls(&certs, true)), root.clone())).await.expect("connect");
    registry.put("/berth-tls-test/key", bytes::Bytes::from_static(b"value")).await.expect("put");
    let read = registry.get("/berth-tls-test/key").await.expect("get").expect("present");
    assert_eq!(&read.value[..], b"value");

    // Wrong or missing pieces: each refused at connect, before anything is served.
    let wrong_password = Some(("root".to_owned(), Secret::new("not-the-password-0123")));
    let cases = [
        ("no user", config(Some(tls(&certs, true)), None)),
        ("wrong password", config(Some(tls(&certs, true)), wrong_password)),
        ("no client certificate", config(Some(tls(&certs, false)), root.clone())),
        ("another CA", config(Some(tls(&other, true)), root.clone())),
    ];
    for (name, config) in cases {
        let outcome = EtcdRegistry::connect(config).await;
        assert!(outcome.is_err(), "{name}: connected");
    }
    let plain = EtcdRegistry::connect(config(None, root.clone())).await.err().expect("https without a CA");
    assert!(plain.to_string().contains("--etcd-ca"), "{plain}");

    // `berth control-plane` with the flags: serves; with a wrong password file it exits
    // naming etcd.
    let password = dir.path().join("etcd.password");
    std::fs::write(&password, format!("{ROOT_PASSWORD}\n")).unwrap();
    let flags = |password: &Path| -> Vec<String> {
        let path = |name: &str| certs.join(name).display().to_string();
        [
            "control-plane",
            "--etcd",
            &endpoint,
            "--key-prefix",
            "/berth-tls",
            "--replica-id",
            "replica-tls",
            "--etcd-ca",
            &path("ca.pem"),
            "--etcd-cert",
            &path("replica.pem"),
            "--etcd-key",
            &path("replica.key"),
            "--etcd-user",
            "root",
            "--etcd-password-file",
            &password.display().to_string(),
        ]
        .map(str::to_owned)
        .to_vec()
    };
    let replica = BerthProcess::start("replica-etcd-tls", flags(&password)).await.expect("replica over etcd tls");
    let session = replica.create_session("alice", "tls").await;
    // No node: the replica answers from etcd (no live node), which proves it reads it.
    let status = session.expect_err("no node registered");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(status.message().contains("no live node"), "{status:?}");
    drop(replica);

    std::fs::write(&password, "not-the-password-0123\n").unwrap();
    let output = std::process::Command::new(berth_binary())
        .args(flags(&password))
        .args(["--listen", "127.0.0.1:0"])
        .output()
        .expect("run berth");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("connecting to etcd at"), "{stderr}");
    drop(etcd);
}

/// etcd's auth tokens expire after `--auth-token-ttl` without use (5 min by default; 1 s
/// here): a replica whose registry sat idle that long must not fail every call with
/// "invalid auth token" until it is restarted. It authenticates again and carries on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_authenticates_again_when_its_etcd_token_expires() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("pki");
    make_certs(&certs);
    let (_etcd, endpoint) = start_etcd(&certs).await;
    let config = EtcdConfig {
        tls: Some(tls(&certs, true)),
        user: Some(("root".to_owned(), Secret::new(ROOT_PASSWORD))),
        ..EtcdConfig::new([endpoint])
    };
    let registry = EtcdRegistry::connect(config).await.expect("connect");
    registry.put("/berth-tls-test/before", bytes::Bytes::from_static(b"1")).await.expect("put");
    // Idle for longer than the token's TTL: that is the case under test, not a wait for it
    // (no condition can be polled: etcd extends a token's TTL each time it is used).
    tokio::time::sleep(Duration::from_secs(3) + TOKEN_TTL).await;
    let read = registry.get("/berth-tls-test/before").await.expect("a read after the token expired");
    assert_eq!(read.expect("present").value.as_ref(), b"1");
    registry.put("/berth-tls-test/after", bytes::Bytes::from_static(b"2")).await.expect("a write after it");
}
