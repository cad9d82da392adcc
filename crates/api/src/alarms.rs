//! `/api/v1/rules` and `/api/v1/alarms`: alarm rules (validated, stored,
//! applied from the next data unit) and the alarms they raise, with their
//! `ack` and `clear` actions. Everything goes through the pipeline's rule
//! engine, which owns the alarms' lifecycle and their dispatch.

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;
use bytes::Bytes;
use serde::Deserialize;
use serde_json::{json, Value};
use weft_model::{Alarm, RuleSpec, Severity};
use weft_pipeline::rules::RulesError;
use weft_store::AlarmQuery;

use crate::catalog::parse_body;
use crate::routes::{get, post, Access, Routes, Scope::Own};
use crate::{ApiError, ApiResult, AppState};

/// Alarms a listing returns when the client names no `limit`.
pub const DEFAULT_ALARM_LIMIT: usize = 100;

/// The rules and alarms routes: rules are definitions (admin); acking
/// and clearing an alarm changes data (write).
pub fn routes() -> Routes {
    Routes::new()
        .route("/api/v1/rules", get(Access::read(Own), list_rules))
        .route(
            "/api/v1/rules/{id}",
            get(Access::read(Own), get_rule)
                .put(Access::admin(Own), put_rule)
                .delete(Access::admin(Own), delete_rule),
        )
        .route("/api/v1/alarms", get(Access::read(Own), list_alarms))
        .route("/api/v1/alarms/{id}", get(Access::read(Own), get_alarm))
        .route("/api/v1/alarms/{id}/ack", post(Access::write(Own), ack))
        .route("/api/v1/alarms/{id}/clear", post(Access::write(Own), clear))
}

impl From<RulesError> for ApiError {
    fn from(e: RulesError) -> Self {
        match e {
            RulesError::Invalid(text) => ApiError::bad_request(text),
            RulesError::Store(s) => s.into(),
        }
    }
}

/// A rule as the API shows it: its spec with its id.
fn rule_json(id: &str, spec: &RuleSpec) -> Value {
    let mut v = serde_json::to_value(spec).expect("rules serialise");
    if let Value::Object(map) = &mut v {
        map.insert("id".into(), json!(id));
    }
    v
}

/// `GET /api/v1/rules`: every rule, by id.
async fn list_rules(State(state): State<AppState>) -> Json<Value> {
    let rules = state.services.rules.rules();
    Json(Value::Array(
        rules.iter().map(|(id, spec)| rule_json(id, spec)).collect(),
    ))
}

/// `GET /api/v1/rules/{id}`.
async fn get_rule(State(state): State<AppState>, Path(id): Path<String>) -> ApiResult<Json<Value>> {
    let spec = state
        .services
        .rules
        .rule(&id)
        .ok_or_else(|| ApiError::not_found(format!("rule '{id}' does not exist")))?;
    Ok(Json(rule_json(&id, &spec)))
}

/// `PUT /api/v1/rules/{id}`: create (201) or replace (200); applies from
/// the next data unit. An `id` in the body, as listings show it, is ignored.
async fn put_rule(
    State(state): State<AppState>,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<impl IntoResponse> {
    let mut value: Value = parse_body(&body)?;
    match &mut value {
        Value::Object(map) => {
            map.remove("id");
        }
        _ => return Err(ApiError::bad_request("body must be a JSON object")),
    }
    let spec: RuleSpec = weft_model::validate::from_value(value)
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    let created = state.services.rules.put_rule(&id, spec.clone()).await?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(rule_json(&id, &spec))))
}

/// `DELETE /api/v1/rules/{id}`: the rule and its state go; its alarms stay.
async fn delete_rule(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    if state.services.rules.delete_rule(&id).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found(format!("rule '{id}' does not exist")))
    }
}

/// Query parameters of `GET /api/v1/alarms`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct AlarmParams {
    state: Option<String>,
    acked: Option<String>,
    severity: Option<String>,
    device: Option<String>,
    #[serde(rename = "type")]
    alarm_type: Option<String>,
    limit: Option<usize>,
    offset: Option<usize>,
}

impl AlarmParams {
    fn into_query(self) -> ApiResult<AlarmQuery> {
        if let Some(s) = &self.state {
            if s != "active" && s != "cleared" {
                return Err(ApiError::bad_request("state must be 'active' or 'cleared'"));
            }
        }
        let acked = match self.acked.as_deref() {
            None => None,
            Some("true") => Some(true),
            Some("false") => Some(false),
            Some(_) => return Err(ApiError::bad_request("acked must be 'true' or 'false'")),
        };
        if let Some(s) = &self.severity {
            if Severity::parse(s).is_none() {
                return Err(ApiError::bad_request(
                    "severity must be one of critical, major, minor, warning, indeterminate",
                ));
            }
        }
        let limit = self.limit.unwrap_or(DEFAULT_ALARM_LIMIT);
        if limit == 0 {
            return Err(ApiError::bad_request("limit must be at least 1"));
        }
        Ok(AlarmQuery {
            state: self.state,
            acked,
            severity: self.severity,
            device: self.device,
            alarm_type: self.alarm_type,
            limit,
            offset: self.offset.unwrap_or(0),
        })
    }
}

/// `GET /api/v1/alarms?state=&acked=&severity=&device=&type=&limit=&offset=`:
/// newest first.
async fn list_alarms(
    State(state): State<AppState>,
    params: Result<Query<AlarmParams>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<Json<Vec<Alarm>>> {
    let Query(params) = params.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let query = params.into_query()?;
    Ok(Json(state.services.rules.alarms(&query).await?))
}

fn missing(id: &str) -> ApiError {
    ApiError::not_found(format!("alarm '{id}' does not exist"))
}

/// `GET /api/v1/alarms/{id}`.
async fn get_alarm(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Json<Alarm>> {
    let alarm = state.services.rules.alarm(&id).await?;
    alarm.map(Json).ok_or_else(|| missing(&id))
}

/// `POST /api/v1/alarms/{id}/ack`: acknowledges it; 200 with the alarm
/// (acking twice changes nothing the second time).
async fn ack(State(state): State<AppState>, Path(id): Path<String>) -> ApiResult<Json<Alarm>> {
    let alarm = state.services.rules.ack(&id).await?;
    alarm.map(Json).ok_or_else(|| missing(&id))
}

/// `POST /api/v1/alarms/{id}/clear`: clears it; 200 with the alarm.
async fn clear(State(state): State<AppState>, Path(id): Path<String>) -> ApiResult<Json<Alarm>> {
    let alarm = state.services.rules.clear(&id).await?;
    alarm.map(Json).ok_or_else(|| missing(&id))
}
