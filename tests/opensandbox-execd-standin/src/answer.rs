//! The published API's answers: its error body, JSON and empty successes, and its
//! timestamps. Shared by every handler module (so none of them depends on the crate root).

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use http::StatusCode;

/// The error body of the published API: `{code, message}`.
pub fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    let body = serde_json::json!({ "code": code, "message": message.into() });
    (status, [(http::header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

pub fn json(value: serde_json::Value) -> Response {
    (StatusCode::OK, [(http::header::CONTENT_TYPE, "application/json")], value.to_string()).into_response()
}

pub fn empty_ok() -> Response {
    (StatusCode::OK, Body::empty()).into_response()
}

/// RFC 3339 in UTC from seconds since the epoch (civil-from-days, proleptic Gregorian).
pub fn rfc3339(seconds: i64) -> String {
    let days = seconds.div_euclid(86_400);
    let second_of_day = seconds.rem_euclid(86_400);
    let shifted = days + 719_468;
    let era = shifted.div_euclid(146_097);
    let day_of_era = shifted.rem_euclid(146_097);
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 { month_index + 3 } else { month_index - 9 };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        second_of_day / 3600,
        second_of_day % 3600 / 60,
        second_of_day % 60
    )
}
