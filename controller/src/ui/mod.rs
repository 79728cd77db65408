//! The web view at `/ui`, on the REST port: nodes and disks, volumes and
//! their replicas, the plan, the events and the settings, kept live by
//! server-sent events from the store's change subscription.
//!
//! It owns the page's routes, its templates (`templates/ui/`, compiled in
//! by askama) and its small script and style sheet (compiled in too):
//! nothing is fetched from anywhere but this controller. It reads the
//! store and runs the planner on it, and never changes anything itself:
//! the page's actions are the REST API's own calls, sent by its script
//! with the same validation, token and errors as any client.

mod view;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use askama::Template;
use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use tokio_stream::{Stream, StreamExt};

use crate::context::Context;
use crate::error::Error;

/// How often the page is told to refresh with no change heard: times in
/// the plan (a wait ending) move without one.
const TICK: Duration = Duration::from_secs(5);

/// `/ui` (the page), `/ui/live` (its live part as HTML), `/ui/events`
/// (server-sent `change` events), `/ui/app.js` and `/ui/app.css`.
pub fn router() -> Router<Arc<Context>> {
    Router::new()
        .route("/ui", get(page))
        .route("/ui/", get(page))
        .route("/ui/live", get(live))
        .route("/ui/events", get(events))
        .route("/ui/app.js", get(script))
        .route("/ui/app.css", get(style))
}

fn render(t: &impl Template) -> Result<Html<String>, Error> {
    t.render()
        .map(Html)
        .map_err(|e| Error::Internal(format!("the web view did not render: {e}")))
}

async fn page(State(ctx): State<Arc<Context>>) -> Result<Html<String>, Error> {
    let Html(live) = render(&view::live(&ctx).await?)?;
    render(&view::Page { live })
}

async fn live(State(ctx): State<Arc<Context>>) -> Result<Html<String>, Error> {
    render(&view::live(&ctx).await?)
}

/// `change` on every change the store reports (and on a lagging
/// subscription, which missed some), and every [`TICK`].
async fn events(
    State(ctx): State<Arc<Context>>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let changes = tokio_stream::wrappers::BroadcastStream::new(ctx.store.subscribe())
        .map(|_| Ok(change("store")));
    let ticks = tokio_stream::wrappers::IntervalStream::new(tokio::time::interval(TICK))
        .map(|_| Ok(change("tick")));
    Sse::new(changes.merge(ticks)).keep_alive(KeepAlive::default())
}

/// A `change` event. Its data is never empty: a browser drops an event
/// with no data without a word.
fn change(why: &str) -> Event {
    Event::default().event("change").data(why)
}

async fn script() -> Response {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        include_str!("app.js"),
    )
        .into_response()
}

async fn style() -> Response {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        include_str!("app.css"),
    )
        .into_response()
}
