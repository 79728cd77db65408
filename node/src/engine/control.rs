//! The engine's control socket, `<state-dir>/frontends/<volume>.ctl`: the
//! node agent asks a running engine to add or remove a replica. One JSON
//! request per line, one JSON answer per line:
//! `{"op":"add","replica":"NAME@HOST:PORT","source":"NAME"}` or
//! `{"op":"remove","replica":"NAME"}`; the answer is `{"ok":true}` or
//! `{"error":"..."}`.

use std::path::Path;
use std::sync::Arc;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

use super::{Engine, ReplicaAddr};

#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum ControlRequest {
    Add {
        replica: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        source: Option<String>,
    },
    Remove {
        replica: String,
    },
}

async fn handle(engine: &Arc<Engine>, line: &str) -> Result<(), String> {
    let req: ControlRequest = serde_json::from_str(line).map_err(|e| format!("request: {e}"))?;
    match req {
        ControlRequest::Add { replica, source } => {
            let at: ReplicaAddr = replica.parse()?;
            engine
                .add_replica(at, source)
                .await
                .map_err(|e| e.to_string())
        }
        ControlRequest::Remove { replica } => engine
            .remove_replica(&replica)
            .await
            .map_err(|e| e.to_string()),
    }
}

/// Serves the control socket until the task is dropped.
pub async fn serve(engine: Arc<Engine>, path: &Path) -> std::io::Result<()> {
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path)?;
    loop {
        let (stream, _) = listener.accept().await?;
        let engine = engine.clone();
        tokio::spawn(async move {
            let (rd, mut wr) = stream.into_split();
            let mut lines = BufReader::new(rd).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let answer = match handle(&engine, &line).await {
                    Ok(()) => serde_json::json!({"ok": true}),
                    Err(e) => serde_json::json!({"error": e}),
                };
                if wr
                    .write_all(format!("{answer}\n").as_bytes())
                    .await
                    .is_err()
                {
                    return;
                }
            }
        });
    }
}

/// Sends one request to the engine behind `path` and waits for its answer.
pub async fn call(path: &Path, req: &ControlRequest) -> Result<(), String> {
    let stream = UnixStream::connect(path)
        .await
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let (rd, mut wr) = stream.into_split();
    let line = serde_json::to_string(req).map_err(|e| e.to_string())?;
    wr.write_all(format!("{line}\n").as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut lines = BufReader::new(rd).lines();
    let answer = lines
        .next_line()
        .await
        .map_err(|e| e.to_string())?
        .ok_or("the engine closed its control socket")?;
    let v: serde_json::Value = serde_json::from_str(&answer).map_err(|e| e.to_string())?;
    match v["error"].as_str() {
        Some(e) => Err(e.to_string()),
        None => Ok(()),
    }
}
