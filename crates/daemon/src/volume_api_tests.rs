use super::*;
use block::BlockDevice;

fn offline(dir: &std::path::Path) -> Offline {
    let text = format!(
        "[[pool]]\nname = \"tank\"\ndevices = [\"{}/t0.img\"]\ndevice_size = \"16M\"\nunit_size = \"64K\"\n",
        dir.display()
    );
    Offline::new(control::parse_config(&text, "t.toml").unwrap())
}

fn call(s: &dyn PoolSource, method: &str, path: &str, body: Value) -> (u16, Value) {
    let body = if body.is_null() {
        Vec::new()
    } else {
        body.to_string().into_bytes()
    };
    answer(s, method, path, &body).expect("a pool path")
}

fn wait_for(s: &dyn PoolSource, job: &Value) -> Value {
    let path = format!(
        "/v1/pools/{}/jobs/{}",
        job["pool"].as_str().unwrap(),
        job["id"]
    );
    loop {
        let (status, j) = call(s, "GET", &path, Value::Null);
        assert_eq!(status, 200, "{j}");
        if j["state"] != "running" {
            return j;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

#[test]
fn volumes_go_through_their_life_over_the_api() {
    let dir = tempfile::tempdir().unwrap();
    let s = offline(dir.path());
    assert!(answer(&s, "GET", "/v1/config", b"").is_none());
    let (status, v) = call(
        &s,
        "POST",
        "/v1/volumes/tank",
        json!({"name": "vm 1", "size": "1M"}),
    );
    assert_eq!((status, &v["size"]), (201, &json!(1 << 20)), "{v}");
    let (status, v) = call(
        &s,
        "POST",
        "/v1/volumes/tank",
        json!({"name": "vm 1", "size": 4096}),
    );
    assert_eq!(status, 409, "{v}");
    let vm = format!("/v1/volumes/tank/{}", percent_encode("vm 1"));
    assert_eq!(vm, "/v1/volumes/tank/vm%201");
    let pool = (&s as &dyn PoolSource).pool("tank").unwrap();
    pool.volume("vm 1")
        .unwrap()
        .write_at(&[1; 4096], 0, false)
        .unwrap();
    let (status, snap) = call(&s, "POST", &format!("{vm}/snapshot"), json!({"name": "s"}));
    assert_eq!(
        (status, snap["kind"].as_str()),
        (201, Some("snapshot")),
        "{snap}"
    );
    let (status, c) = call(&s, "POST", "/v1/volumes/tank/s/clone", json!({"name": "c"}));
    assert_eq!((status, c["parent"].as_str()), (201, Some("s")), "{c}");
    assert_eq!(c["mapped"], 65536);
    assert_eq!(c["own"], 0);
    let (status, _) = call(&s, "POST", "/v1/volumes/tank/c/promote", Value::Null);
    assert_eq!(status, 200);
    let (status, v) = call(
        &s,
        "POST",
        &format!("{vm}/rollback"),
        json!({"snapshot": "s"}),
    );
    assert_eq!(
        status, 400,
        "the snapshot is the clone's after promote: {v}"
    );
    let (status, v) = call(
        &s,
        "POST",
        "/v1/volumes/tank/c/resize",
        json!({"size": "2M"}),
    );
    assert_eq!((status, &v["size"]), (200, &json!(2 << 20)), "{v}");
    let (status, v) = call(
        &s,
        "POST",
        "/v1/volumes/tank/c/resize",
        json!({"size": 1000}),
    );
    assert_eq!(status, 400, "{v}");
    let (_, all) = call(&s, "GET", "/v1/volumes", Value::Null);
    assert_eq!(all["volumes"].as_array().unwrap().len(), 3);
    // Deleting a volume with snapshots fails in its job.
    let (status, d) = call(&s, "DELETE", "/v1/volumes/tank/c", Value::Null);
    assert_eq!(status, 202);
    let j = wait_for(&s, &d["job"]);
    assert_eq!(j["state"], "failed", "{j}");
    assert!(
        j["error"].as_str().unwrap().contains("has snapshots"),
        "{j}"
    );
    for name in ["s", "c", "vm%201"] {
        let (status, d) = call(
            &s,
            "DELETE",
            &format!("/v1/volumes/tank/{name}"),
            Value::Null,
        );
        assert_eq!(status, 202, "{d}");
        let j = wait_for(&s, &d["job"]);
        assert_eq!(
            (j["state"].as_str(), j["percent"].as_u64()),
            (Some("done"), Some(100)),
            "{j}"
        );
    }
    let (_, p) = call(&s, "GET", "/v1/pools/tank", Value::Null);
    assert_eq!(
        (p["used"].as_u64(), p["volumes"].as_array().map(Vec::len)),
        (Some(0), Some(0)),
        "{p}"
    );
    let (_, check) = call(&s, "POST", "/v1/pools/tank/check", Value::Null);
    assert_eq!(check["clean"], true, "{check}");
}

#[test]
fn a_thick_volume_is_preallocated_by_a_job() {
    let dir = tempfile::tempdir().unwrap();
    let s = offline(dir.path());
    let (status, v) = call(
        &s,
        "POST",
        "/v1/volumes/tank",
        json!({"name": "t", "size": "2M", "thick": true}),
    );
    assert_eq!(status, 202, "{v}");
    let j = wait_for(&s, &v["job"]);
    assert_eq!(
        (j["state"].as_str(), j["total"].as_u64()),
        (Some("done"), Some(32)),
        "{j}"
    );
    let (_, p) = call(&s, "GET", "/v1/pools", Value::Null);
    assert_eq!(p["pools"][0]["used"], 2 << 20, "{p}");
    let (status, v) = call(
        &s,
        "POST",
        "/v1/volumes/tank",
        json!({"name": "big", "size": "1G", "thick": true}),
    );
    assert_eq!(status, 507, "{v}");
    assert!((&s as &dyn PoolSource)
        .pool("tank")
        .unwrap()
        .volume_info("big")
        .is_err());
}

#[test]
fn bad_requests_name_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let s = offline(dir.path());
    let (_, v) = call(&s, "GET", "/v1/pools/tank", Value::Null);
    assert!(
        v["error"].as_str().unwrap().contains("not created yet"),
        "{v}"
    );
    assert!(
        !dir.path().join("t0.img").exists(),
        "reading formats nothing"
    );
    let (status, v) = call(&s, "POST", "/v1/pools/tank", Value::Null);
    assert_eq!((status, &v["size"]), (200, &json!(255 * 65536)), "{v}");
    let cases = [
        (
            "GET",
            "/v1/pools/nope",
            json!(null),
            404,
            "no pool named nope",
        ),
        (
            "GET",
            "/v1/volumes/tank/nope",
            json!(null),
            404,
            "no volume named nope",
        ),
        (
            "POST",
            "/v1/volumes/tank",
            json!({"size": 1}),
            400,
            "`name`",
        ),
        (
            "POST",
            "/v1/volumes/tank",
            json!({"name": "x"}),
            400,
            "`size`",
        ),
        (
            "POST",
            "/v1/volumes/tank",
            json!({"name": "x", "size": "lots"}),
            400,
            "`size`",
        ),
        ("PUT", "/v1/volumes/tank", json!(null), 405, "PUT"),
        (
            "POST",
            "/v1/volumes/tank/x/explode",
            json!(null),
            404,
            "explode",
        ),
        (
            "GET",
            "/v1/pools/tank/jobs/999",
            json!(null),
            404,
            "no job 999",
        ),
        ("GET", "/v1/volumes/tank/%zz", json!(null), 404, ""),
    ];
    for (method, path, body, status, says) in cases {
        let (got, v) =
            answer(&s, method, path, body.to_string().as_bytes()).unwrap_or((404, Value::Null));
        assert_eq!(got, status, "{method} {path}: {v}");
        assert!(
            v["error"].as_str().unwrap_or("").contains(says),
            "{method} {path}: {v}"
        );
    }
    let (status, v) = answer(&s, "POST", "/v1/volumes/tank", b"{not json").unwrap();
    assert_eq!(status, 400, "{v}");
}
