//! The web view at `/ui`, in a real browser: Debian's chromium, headless,
//! driven through chromedriver (WebDriver) by fantoccini. The page is
//! checked for what it shows against what the REST API says, for its
//! actions (taken with the keyboard), for a rebuild's progress as it moves,
//! and by axe-core's accessibility rules at a laptop's and a 4K width.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};

const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
const CHROMIUM: &str = "/usr/bin/chromium";

/// chromedriver, killed on drop.
struct Driver(Child);

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// axe-core's script, which ./test installs from npm.
fn axe_script() -> String {
    let dir = std::env::var("BALLAST_JS_TOOLS").unwrap_or_else(|_| {
        panic!("BALLAST_JS_TOOLS is not set: run the suite with ./test, which installs axe-core (npm) into target/js-tools and sets it")
    });
    let path = Path::new(&dir).join("node_modules/axe-core/axe.min.js");
    std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; ./test installs it (npm install axe-core@4.14.1)",
            path.display()
        )
    })
}

async fn browser(dir: &Path) -> (Driver, Client) {
    for tool in [CHROMEDRIVER, CHROMIUM] {
        assert!(
            Path::new(tool).exists(),
            "{tool} is missing: ./test installs it (Debian packages chromium and chromium-driver)"
        );
    }
    let port = free_addr().port();
    let driver = Driver(
        Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .arg(format!(
                "--log-path={}",
                dir.join("chromedriver.log").display()
            ))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        json!({
            "binary": CHROMIUM,
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                     "--disable-dev-shm-usage", "--window-size=1440,1000",
                     format!("--user-data-dir={}", dir.join("chromium").display())],
        }),
    );
    let url = format!("http://127.0.0.1:{port}");
    let start = Instant::now();
    let client = loop {
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        match ClientBuilder::new(connector)
            .capabilities(caps.clone())
            .connect(&url)
            .await
        {
            Ok(c) => break c,
            Err(e) => {
                assert!(
                    start.elapsed() < Duration::from_secs(60),
                    "chromedriver at {url} gives no session: {e}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    (driver, client)
}

/// Runs `f` (which makes a runtime of its own, as the REST helpers do) on
/// a thread outside this test's runtime.
fn outside<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| s.spawn(f).join().unwrap())
}

/// Runs `script` (a function body) in the page and returns its value.
async fn js(page: &Client, script: &str) -> Value {
    page.execute(script, vec![])
        .await
        .unwrap_or_else(|e| panic!("{script}: {e}"))
}

/// Types `keys` into the element `css` finds. The live part of the page
/// is swapped on every change, so an element found a moment ago may be
/// gone: it is found again. Chromium calls an element that is swapped out
/// during the command either stale or "not interactable" (it is detached,
/// so it has no size), and both are retried.
async fn type_into(page: &Client, css: &str, keys: &str) {
    for _ in 0..50 {
        match page.find(Locator::Css(css)).await {
            Ok(el) => match el.send_keys(keys).await {
                Ok(()) => return,
                Err(e)
                    if e.to_string().contains("stale element")
                        || e.to_string().contains("not interactable") => {}
                Err(e) => panic!("{css}: {e}"),
            },
            Err(e) => panic!("{css}: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{css} was swapped out 50 times in a row");
}

/// Waits until `script` returns something other than null or false.
async fn js_until(page: &Client, what: &str, script: &str) -> Value {
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        let v = js(page, script).await;
        if !v.is_null() && v != Value::Bool(false) {
            return v;
        }
        let shown = js(page, "return document.getElementById('live').innerText").await;
        assert!(
            Instant::now() < end,
            "the page never showed {what}; it shows:\n{}",
            shown.as_str().unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// axe-core's WCAG 2 A and AA rules on the page as it is: some rules
/// checked (axe ran), and no violations.
async fn accessible(page: &Client, axe: &str, width: &str) {
    js(page, axe).await;
    let found = page
        .execute_async(
            "const done = arguments[arguments.length - 1];
             axe.run(document, { runOnly: ['wcag2a', 'wcag2aa'] })
                .then(r => done({ passed: r.passes.map(p => p.id),
                    violations: r.violations.map(v => ({ id: v.id, help: v.help,
                        nodes: v.nodes.map(n => n.html).slice(0, 3) })) }))
                .catch(e => done({ passed: [], violations: [{ id: 'axe failed', help: String(e) }] }));",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(
        found["violations"],
        json!([]),
        "axe-core finds the page inaccessible at the {width} width"
    );
    let passed = found["passed"].as_array().unwrap();
    for rule in ["color-contrast", "label", "button-name", "html-has-lang"] {
        assert!(
            passed.contains(&json!(rule)),
            "axe-core did not check {rule} at the {width} width: {passed:?}"
        );
    }
}

/// Where the screenshots go: docs/images when BALLAST_UPDATE_SCREENSHOTS
/// is set (how docs/web-view.md's were taken), else the test's directory.
fn screenshot_dir(dir: &Path) -> PathBuf {
    if std::env::var_os("BALLAST_UPDATE_SCREENSHOTS").is_some() {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/images")
    } else {
        dir.to_path_buf()
    }
}

fn png(bytes: &[u8]) -> (u32, u32) {
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "a screenshot is a PNG");
    let be = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
    (be(&bytes[16..20]), be(&bytes[20..24]))
}

#[test]
fn the_web_view_shows_replicas_a_rebuild_and_the_plan_and_its_actions_work_by_keyboard() {
    let axe = axe_script();
    let dir = tempfile::tempdir().unwrap();
    let _teardown = Teardown(dir.path().to_path_buf());
    let local = start_local(&dir.path().join("cluster"));
    let api = local.api.clone();
    free_space_is_not_the_test(&api);

    // A volume of one replica, attached and written (the data a rebuild
    // will copy), and one that then asks for more replicas than there are
    // nodes.
    for (name, size, count) in [("v", "512Mi", 1), ("wide", "64Mi", 3)] {
        let (s, v) = call(
            "POST",
            &format!("{api}/v1/volumes"),
            Some(json!({"name": name, "size": size, "numberOfReplicas": count})),
        );
        assert_eq!(s, 201, "{v}");
    }
    let (s, v) = call(
        "PATCH",
        &format!("{api}/v1/volumes/wide"),
        Some(json!({"numberOfReplicas": 4})),
    );
    assert_eq!(s, 200, "{v}");
    let endpoint = attach(&api, "v", "node-1");
    let (ok, out) = qemu_io(&endpoint, &["write -P 0x6b 0 448M"]);
    assert!(ok, "{out}");
    let first = get_json(&format!("{api}/v1/replicas?volume=v")).unwrap()["items"][0].clone();
    let (first_name, first_node) = (
        first["name"].as_str().unwrap().to_string(),
        first["spec"]["nodeId"].as_str().unwrap().to_string(),
    );
    // What the plan says about the volume it cannot place in full.
    let blocked = wait_for(Duration::from_secs(30), "the plan blocked on wide", || {
        let plan = get_json(&format!("{api}/v1/plan"))?;
        plan["blocked"]
            .as_array()?
            .iter()
            .find(|b| b["object"] == "volume/wide")
            .map(|b| b["reason"].as_str().unwrap().to_string())
    });

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let (_driver, page) = browser(dir.path()).await;
        page.goto(&format!("{api}/ui")).await.unwrap();
        js_until(
            &page,
            "that it is live",
            "return document.getElementById('connection').textContent === 'Live'",
        )
        .await;

        // Every node, with its disk's bar; the replica on its node.
        for n in ["node-1", "node-2", "node-3"] {
            let row = js(
                &page,
                &format!("return document.getElementById('node-{n}').innerText"),
            )
            .await;
            let row = row.as_str().unwrap();
            assert!(row.contains("Ready") && row.contains("disk-1"), "{row}");
        }
        let shown = js_until(
            &page,
            "v's replica",
            &format!(
                "const li = document.getElementById('replica-{first_name}');
                 return li && li.querySelector('.where').textContent"
            ),
        )
        .await;
        assert_eq!(shown, json!(format!("{first_node}/disk-1")));

        // The plan's reason, as the API words it.
        js_until(
            &page,
            "the plan's reason for wide",
            &format!(
                "return [...document.querySelectorAll('#plan-blocked li')]
                    .some(li => li.textContent.includes('volume/wide') && li.textContent.includes({}))",
                serde_json::to_string(&blocked).unwrap()
            ),
        )
        .await;

        // Cordon node-3 with the keyboard: the page says so, and so does
        // the API.
        let label = js(&page, "return document.getElementById('cordon-node-3').textContent").await;
        assert_eq!(label, json!("Cordon node-3"));
        type_into(&page, "#cordon-node-3", "\u{E007}").await;
        js_until(
            &page,
            "node-3 cordoned",
            "return document.getElementById('node-node-3').textContent.includes('Cordoned')",
        )
        .await;
        let n3 = outside(|| node(&api, "node-3").unwrap());
        assert_eq!(n3["status"]["cordoned"], true, "{n3}");

        // A bad replica count is refused with the API's words, and nothing
        // changes.
        js(&page, "document.getElementById('count-v').value = ''").await;
        type_into(&page, "#count-v", "0\u{E007}").await;
        let said = js_until(
            &page,
            "the API's refusal",
            "const n = document.getElementById('notice'); return n.className === 'bad' && n.textContent",
        )
        .await;
        assert!(
            said.as_str().unwrap().contains("numberOfReplicas"),
            "{said}"
        );
        let v = outside(|| get_json(&format!("{api}/v1/volumes/v")).unwrap());
        assert_eq!(v["spec"]["numberOfReplicas"], 1, "{v}");

        // A setting: a value it does not take is refused with the values
        // it does; one it takes is stored.
        js(
            &page,
            "const s = document.getElementById('setting-name');
             s.value = 'replica-auto-balance';
             s.dispatchEvent(new Event('change', { bubbles: true }));
             document.getElementById('setting-value').value = '';",
        )
        .await;
        type_into(&page, "#setting-value", "sometimes\u{E007}").await;
        let said = js_until(
            &page,
            "the setting refused",
            "const n = document.getElementById('notice');
             return n.className === 'bad' && n.textContent.includes('replica-auto-balance') && n.textContent",
        )
        .await;
        assert!(
            said.as_str().unwrap().contains("disabled, least-effort, best-effort"),
            "{said}"
        );
        js(&page, "document.getElementById('setting-value').value = ''").await;
        type_into(&page, "#setting-value", "best-effort\u{E007}").await;
        js_until(
            &page,
            "the setting changed",
            "return [...document.querySelectorAll('#setting-name option')]
                .some(o => o.textContent === 'replica-auto-balance = best-effort')",
        )
        .await;
        let set = outside(|| get_json(&format!("{api}/v1/settings/replica-auto-balance")).unwrap());
        assert_eq!(set["value"], "best-effort", "{set}");

        // Two replicas: the new one's rebuild shows its progress below 100,
        // and it ends rw.
        js(&page, "document.getElementById('count-v').value = ''").await;
        type_into(&page, "#count-v", "2\u{E007}").await;
        let mut seen: Vec<u64> = Vec::new();
        let end = Instant::now() + Duration::from_secs(120);
        loop {
            let state = js(
                &page,
                &format!(
                    "return [...document.querySelectorAll('#volume-v li[data-replica]')]
                        .filter(li => li.dataset.replica !== '{first_name}')
                        .map(li => ({{ mode: li.dataset.mode,
                                      progress: li.querySelector('progress')?.value ?? null }}))"
                ),
            )
            .await;
            if let Some(p) = state[0]["progress"].as_f64()
                && seen.last() != Some(&(p as u64))
            {
                seen.push(p as u64);
            }
            if state[0]["mode"] == "rw" {
                break;
            }
            if Instant::now() > end {
                let notice = js(
                    &page,
                    "return [document.getElementById('connection').textContent,
                             document.getElementById('as-of').textContent,
                             document.getElementById('notice').textContent]",
                )
                .await;
                let v = outside(|| get_json(&format!("{api}/v1/volumes/v")));
                panic!("the rebuild never ended: {state}; the page says (connection, as of, notice) {notice}; v is {v:?}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        eprintln!("rebuild progress the page showed: {seen:?}");
        assert!(
            seen.iter().any(|p| *p < 100),
            "the page never showed the rebuild below 100%: {seen:?}"
        );
        let (ok, out) = qemu_io(&endpoint, &["read -P 0x6b 0 448M"]);
        assert!(ok, "the data after the rebuild: {out}");

        // Readable, and accessible, at a laptop's width and at 4K; the
        // screenshots go into the docs.
        let shots = screenshot_dir(dir.path());
        for (width, height, name) in [(1366, 900, "laptop"), (3840, 2160, "4k")] {
            page.set_window_size(width, height).await.unwrap();
            let overflow = js(
                &page,
                "return document.documentElement.scrollWidth - document.documentElement.clientWidth",
            )
            .await;
            assert_eq!(overflow, json!(0), "the page scrolls sideways at {name}");
            accessible(&page, &axe, name).await;
            let shot = page.screenshot().await.unwrap();
            let inner = js(&page, "return window.innerWidth * window.devicePixelRatio").await;
            assert_eq!(
                Some(u64::from(png(&shot).0)),
                inner.as_f64().map(|w| w as u64),
                "the {name} screenshot is of the whole window's width"
            );
            std::fs::write(shots.join(format!("web-view-{name}.png")), shot).unwrap();
        }
        page.close().await.unwrap();
    });
    drop(local);
}
