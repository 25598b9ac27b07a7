//! `GET /v1/stats/live` (and `/console/api/v1/stats/live` for a console
//! session): Server-Sent Events. First an `history` event
//! with the samples kept (a JSON array), then each new sample as it is
//! taken. A stream that falls behind skips to the newest samples.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http_body_util::BodyExt;
use hyper::body::{Bytes, Frame};
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::Response;
use tokio::sync::{broadcast, mpsc};

use crate::responses::full;
use crate::{Body, Live};

pub fn stream(live: &Arc<Live>) -> Response<Body> {
    let (history, mut samples) = live.subscribe();
    let (sender, receiver) = mpsc::channel::<Bytes>(4);
    let first = format!("event: history\ndata: [{}]\n\n", history.join(","));
    tokio::spawn(async move {
        if sender.send(first.into()).await.is_err() {
            return;
        }
        loop {
            let sample = match samples.recv().await {
                Ok(sample) => sample,
                Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => return,
            };
            // The browser went away: the send fails and the task ends.
            if sender
                .send(format!("data: {sample}\n\n").into())
                .await
                .is_err()
            {
                return;
            }
        }
    });
    let mut answer = full(200, "text/event-stream", Bytes::new());
    *answer.body_mut() = Events(receiver).boxed();
    answer
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    answer
}

/// A body of whatever the channel delivers, until it closes.
struct Events(mpsc::Receiver<Bytes>);

impl hyper::body::Body for Events {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        self.0
            .poll_recv(cx)
            .map(|chunk| chunk.map(|c| Ok(Frame::data(c))))
    }
}
