//! The way back to devices: per-device downlink queues, encoded by the
//! device type's codec, sent by a delivery worker ([`delivery`]) through
//! the integration the device's uplinks came from, and the NGSI command
//! pattern of the FIWARE IoT Agents on top.
//!
//! Data flow: the API (or an NGSI update of a command attribute) calls
//! [`Downlinks::queue`], which encodes `data` with `encodeDownlink`,
//! stores the downlinks and wakes the worker; the ingest paths tell
//! [`Downlinks::observe_route`] how each device's uplinks arrive (TTN's
//! `X-Downlink-*` headers, ChirpStack's DevEUI, Helium's `downlink_url`,
//! the MQTT source and topic a device publishes on);
//! the worker claims what is due, sends it, and records `sent`, a retry,
//! `failed` or `expired`, keeping `<command>_status` / `<command>_info` on
//! the device's entity in step for commands.

pub mod delivery;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::{json, Map, Value};
use tokio::sync::Notify;
use weft_engine::{
    interpret_decode_uplink, interpret_encode_downlink, reported_problems, Call, CodecError, Engine,
};
use weft_model::device::Variables;
use weft_model::downlink::{check_length, ChirpStackApi, DownlinkPayload, DownlinkRequest};
use weft_model::ngsi::{self, AttrMap, Attribute};
use weft_model::{now_ms, Downlink, DownlinkRoute, DownlinkStatus};
use weft_store::{Store, StoreError};

use crate::catalog::{Catalog, TypeEntry};
use crate::context::{Context, DEFAULT_TENANT};

/// How downlinks are sent; the defaults suit network servers on the
/// internet.
#[derive(Debug, Clone)]
pub struct DownlinksConfig {
    /// Wait before the first retry of a failed attempt; doubled for each
    /// further one up to `retry_max`, each wait ±20 % at random
    /// ([`DownlinksConfig::backoff`]).
    pub retry_initial: Duration,
    /// Longest wait between two attempts.
    pub retry_max: Duration,
    /// Attempts before a downlink is marked `failed`.
    pub max_attempts: u32,
    /// How long one HTTP attempt may take.
    pub request_timeout: Duration,
    /// How often a `pending` downlink (no route yet, or a route needing an
    /// MQTT connection) is looked at again, besides when its device's
    /// route changes.
    pub pending_recheck: Duration,
    /// ChirpStack's REST API for devices whose uplinks came from
    /// ChirpStack, unless their type has its own in `chirpstack_by_type`.
    pub chirpstack: Option<ChirpStackApi>,
    /// ChirpStack's REST API per device type name.
    pub chirpstack_by_type: HashMap<String, ChirpStackApi>,
}

impl DownlinksConfig {
    /// The retry policy of failed attempts: `retry_initial` doubled per
    /// failed attempt up to `retry_max`, ±20 % so that the downlinks a
    /// network server's outage failed together are not all sent again at
    /// the same instant.
    pub fn backoff(&self) -> crate::outbound::Backoff {
        crate::outbound::Backoff {
            initial: self.retry_initial,
            multiplier: 2.0,
            max: self.retry_max.max(self.retry_initial),
            jitter: crate::outbound::Jitter::Ratio(0.2),
        }
    }
}

impl Default for DownlinksConfig {
    fn default() -> Self {
        DownlinksConfig {
            retry_initial: Duration::from_secs(1),
            retry_max: Duration::from_secs(60),
            max_attempts: 8,
            request_timeout: Duration::from_secs(10),
            pending_recheck: Duration::from_secs(60),
            chirpstack: None,
            chirpstack_by_type: HashMap::new(),
        }
    }
}

/// Why a downlink request was refused.
#[derive(Debug, thiserror::Error)]
pub enum DownlinkError {
    /// The device is not registered.
    #[error("device '{0}' does not exist")]
    UnknownDevice(String),
    /// The request cannot be encoded: no codec, a codec without
    /// `encodeDownlink`, or a codec that returned errors or bad output.
    /// `errors` holds the codec's own `errors` array when it returned one.
    #[error("{description}")]
    Encode {
        /// What went wrong, for the user.
        description: String,
        /// The codec's own errors, as it returned them.
        errors: Vec<String>,
        /// The warnings the codec returned with its errors, so a user
        /// sees everything it said (empty when it said nothing).
        warnings: Vec<String>,
        /// The device type has no codec, or its codec no encoder: commands
        /// then send their value as it is.
        no_encoder: bool,
    },
    /// The script engine is overloaded: retry later.
    #[error("script engine is busy, retry later")]
    Busy,
    /// The store failed (or is overloaded).
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What a downlink's `data` encoded to (or its raw bytes, as given).
#[derive(Debug, Clone, PartialEq)]
pub struct EncodedDownlink {
    /// The payload to send.
    pub bytes: Vec<u8>,
    /// The port: the codec's when it chose one, else the request's.
    pub f_port: u32,
    /// Problems the codec noticed but encoded through, for the encode dry
    /// run to show (a queued downlink does not keep them).
    pub warnings: Vec<String>,
}

/// The downlink service: queues, routes, commands, and the worker's wake-up.
pub struct Downlinks {
    store: Arc<dyn Store>,
    catalog: Arc<Catalog>,
    context: Arc<Context>,
    engine: Engine,
    config: DownlinksConfig,
    /// Wakes the delivery worker when something was queued or a route
    /// changed, so a downlink goes out at once instead of at the next poll.
    wake: Notify,
    /// The route last stored per device, so the ingest paths write a
    /// route only when it changes, not per uplink. Bounded by the number of
    /// devices that send uplinks.
    routes: Mutex<HashMap<String, DownlinkRoute>>,
    /// weft's outbound HTTP client ([`crate::outbound::http`]); each
    /// delivery gives its request `request_timeout`.
    client: reqwest::Client,
    /// The MQTT connections (sources, the embedded broker) MQTT routes
    /// publish on.
    mqtt: Arc<crate::mqtt::Links>,
}

impl Downlinks {
    /// Builds the service; the caller spawns [`Downlinks::run`].
    pub fn new(
        store: Arc<dyn Store>,
        catalog: Arc<Catalog>,
        context: Arc<Context>,
        engine: Engine,
        config: DownlinksConfig,
        mqtt: Arc<crate::mqtt::Links>,
    ) -> Downlinks {
        let client = crate::outbound::http();
        Downlinks {
            store,
            catalog,
            context,
            engine,
            config,
            wake: Notify::new(),
            routes: Mutex::new(HashMap::new()),
            client,
            mqtt,
        }
    }

    /// Queues `requests` for `device_id` (after its open downlinks, or
    /// instead of them with `replace`), encoding `data` with the device
    /// type's `encodeDownlink`. All or nothing: one request that cannot be
    /// encoded refuses them all. Answers the stored downlinks.
    pub async fn queue(
        &self,
        device_id: &str,
        requests: Vec<DownlinkRequest>,
        replace: bool,
    ) -> Result<Vec<Downlink>, DownlinkError> {
        let device = self
            .catalog
            .device(device_id)
            .ok_or_else(|| DownlinkError::UnknownDevice(device_id.to_string()))?;
        let device_type = self.catalog.device_type(&device.device_type);
        let encoded = self
            .encode(device_type.as_deref(), &device.variables, &requests)
            .await?;
        let now = now_ms();
        let downlinks = requests
            .into_iter()
            .zip(encoded)
            .map(|(request, encoded)| {
                new_downlink(device_id, request, encoded.bytes, encoded.f_port, None, now)
            })
            .collect();
        self.store_queued(device_id, downlinks, replace).await
    }

    /// Stores queued downlinks, follows the commands a replace removed,
    /// and wakes the worker.
    async fn store_queued(
        &self,
        device_id: &str,
        downlinks: Vec<Downlink>,
        replace: bool,
    ) -> Result<Vec<Downlink>, DownlinkError> {
        let removed = self
            .store
            .queue_downlinks(device_id, &downlinks, replace)
            .await?;
        metrics::counter!("weft_downlinks_queued_total").increment(downlinks.len() as u64);
        for gone in removed {
            self.follow_command(
                &gone,
                "EXPIRED",
                Some(json!("replaced by a newer downlink")),
            )
            .await;
        }
        self.wake.notify_one();
        Ok(downlinks)
    }

    /// Encodes `data` as a downlink of a device of `device_type` would be
    /// encoded, with `variables` as the codec's `input.variables`, storing
    /// and sending nothing: the encode dry run, what a codec editor tests
    /// (`device_type` may be a candidate not saved yet, see
    /// [`Catalog::candidate`]). It goes through the same steps as
    /// [`Downlinks::queue`], so it answers what a queued downlink would
    /// be, or the same refusal (a type without a codec is refused with a
    /// text that says how to test one).
    pub async fn encode_dry_run(
        &self,
        device_type: &TypeEntry,
        data: Value,
        f_port: Option<u32>,
        variables: &Variables,
    ) -> Result<EncodedDownlink, DownlinkError> {
        if device_type.codec.is_none() {
            return Err(DownlinkError::Encode {
                description: format!(
                    "device type '{}' has no codec: save one that defines encodeDownlink, \
                     or send it as `encoder` to test it unsaved",
                    device_type.name
                ),
                errors: Vec::new(),
                warnings: Vec::new(),
                no_encoder: true,
            });
        }
        let request = DownlinkRequest {
            f_port,
            confirmed: false,
            priority: "NORMAL".to_string(),
            payload: DownlinkPayload::Data(data),
            expires_at: None,
        };
        let mut encoded = self
            .encode(Some(device_type), variables, std::slice::from_ref(&request))
            .await?;
        Ok(encoded.remove(0))
    }

    /// Encodes each request: raw bytes as they are, `data` through the
    /// codec (one engine round trip for all), which gets the device's
    /// `variables` (none: `{}`).
    async fn encode(
        &self,
        device_type: Option<&TypeEntry>,
        variables: &Variables,
        requests: &[DownlinkRequest],
    ) -> Result<Vec<EncodedDownlink>, DownlinkError> {
        let mut calls = Vec::new();
        for request in requests {
            if let DownlinkPayload::Data(data) = &request.payload {
                let Some((script, _)) = device_type.and_then(|t| t.codec.as_ref()) else {
                    return Err(DownlinkError::Encode {
                        description: format!(
                            "device type '{}' has no codec to encode data; send bytes instead",
                            device_type.map(|t| t.name.as_str()).unwrap_or_default()
                        ),
                        errors: Vec::new(),
                        warnings: Vec::new(),
                        no_encoder: true,
                    });
                };
                let call = Call::EncodeDownlink {
                    script: script.clone(),
                    data: data.clone(),
                    f_port: request.f_port,
                };
                calls.push(if variables.is_empty() {
                    call
                } else {
                    call.with_variables(variables.clone())
                });
            }
        }
        let mut results = match self.engine.run(calls).await {
            Ok(results) => results.into_iter(),
            Err(CodecError::Busy) => return Err(DownlinkError::Busy),
            Err(other) => {
                return Err(DownlinkError::Encode {
                    description: other.to_string(),
                    errors: Vec::new(),
                    warnings: Vec::new(),
                    no_encoder: false,
                })
            }
        };
        let mut out = Vec::with_capacity(requests.len());
        for (index, request) in requests.iter().enumerate() {
            let at = |e: String| {
                if requests.len() > 1 {
                    format!("downlinks[{index}]: {e}")
                } else {
                    e
                }
            };
            match &request.payload {
                DownlinkPayload::Raw(bytes) => {
                    out.push(EncodedDownlink {
                        bytes: bytes.clone(),
                        f_port: request.f_port.unwrap_or(1),
                        warnings: Vec::new(),
                    });
                }
                DownlinkPayload::Data(_) => {
                    let refused = |e: CodecError, warnings: Vec<String>| {
                        let errors = match &e {
                            CodecError::Reported(errors) => errors.clone(),
                            _ => Vec::new(),
                        };
                        DownlinkError::Encode {
                            no_encoder: matches!(&e, CodecError::MissingFunction(_)),
                            description: at(e.to_string()),
                            errors,
                            warnings,
                        }
                    };
                    let returned = results
                        .next()
                        .expect("one result per call")
                        .map_err(|e| refused(e, Vec::new()))?;
                    // Read before the result is consumed: a refusal shows
                    // the warnings the codec gave with its errors.
                    let warnings = reported_problems(&returned)
                        .map(|(_, warnings)| warnings)
                        .unwrap_or_default();
                    let encoded =
                        interpret_encode_downlink(returned).map_err(|e| refused(e, warnings))?;
                    check_length(&encoded.bytes).map_err(|e| DownlinkError::Encode {
                        description: at(e),
                        errors: Vec::new(),
                        warnings: encoded.warnings.clone(),
                        no_encoder: false,
                    })?;
                    // The codec's port wins, as on The Things Stack.
                    let port =
                        encoded
                            .f_port
                            .or(request.f_port)
                            .ok_or_else(|| DownlinkError::Encode {
                                description: at(
                                    "the codec chose no fPort and the request gave none".into(),
                                ),
                                errors: Vec::new(),
                                warnings: encoded.warnings.clone(),
                                no_encoder: false,
                            })?;
                    out.push(EncodedDownlink {
                        bytes: encoded.bytes,
                        f_port: port,
                        warnings: encoded.warnings,
                    });
                }
            }
        }
        Ok(out)
    }

    /// The device's downlinks, oldest first, as the API shows them: each
    /// record, plus `decoded` (what the codec's `decodeDownlink` makes of
    /// the bytes) for raw downlinks when the codec has one. 404 as
    /// [`DownlinkError::UnknownDevice`].
    pub async fn list(&self, device_id: &str) -> Result<Vec<Value>, DownlinkError> {
        let device = self
            .catalog
            .device(device_id)
            .ok_or_else(|| DownlinkError::UnknownDevice(device_id.to_string()))?;
        let downlinks = self.store.list_downlinks(device_id).await?;
        let script = self
            .catalog
            .device_type(&device.device_type)
            .and_then(|t| t.codec.as_ref().map(|(script, _)| script.clone()));
        let raw: Vec<usize> = (0..downlinks.len())
            .filter(|i| downlinks[*i].data.is_none())
            .collect();
        let mut decoded: HashMap<usize, Value> = HashMap::new();
        if let Some(script) = script.filter(|_| !raw.is_empty()) {
            let calls = raw
                .iter()
                .map(|i| Call::DecodeDownlink {
                    script: script.clone(),
                    bytes: downlinks[*i].frm_payload.clone(),
                    f_port: downlinks[*i].f_port,
                })
                .collect();
            // Display only: a busy engine or a codec without
            // `decodeDownlink` just shows no decoded data.
            if let Ok(results) = self.engine.run(calls).await {
                for (i, result) in raw.iter().zip(results) {
                    if let Ok(d) = result.and_then(interpret_decode_uplink) {
                        decoded.insert(*i, Value::Object(d.data));
                    }
                }
            }
        }
        Ok(downlinks
            .into_iter()
            .enumerate()
            .map(|(i, d)| {
                let mut value = serde_json::to_value(&d).unwrap_or(Value::Null);
                if let (Some(data), Value::Object(map)) = (decoded.remove(&i), &mut value) {
                    map.insert("decoded".into(), data);
                }
                value
            })
            .collect())
    }

    /// Deletes the device's open downlinks; answers how many.
    pub async fn flush(&self, device_id: &str) -> Result<usize, DownlinkError> {
        if self.catalog.device(device_id).is_none() {
            return Err(DownlinkError::UnknownDevice(device_id.to_string()));
        }
        let removed = self.store.flush_downlinks(device_id).await?;
        for gone in &removed {
            self.follow_command(gone, "EXPIRED", Some(json!("flushed from the queue")))
                .await;
        }
        Ok(removed.len())
    }

    /// Records that `device_id`'s uplinks arrive through `route`. Cheap
    /// when nothing changed (a map look-up); a new or changed route is
    /// stored and wakes the device's pending downlinks. Failures are
    /// logged, never the uplink's problem.
    pub async fn observe_route(&self, device_id: &str, route: DownlinkRoute) {
        if self.routes.lock().get(device_id) == Some(&route) {
            return;
        }
        match self.store.downlink_route(device_id).await {
            Ok(Some(stored)) if stored == route => {}
            Ok(_) => {
                if let Err(error) = self.store.put_downlink_route(device_id, &route).await {
                    tracing::warn!(%error, device = device_id, "could not store a downlink route");
                    return;
                }
                let _ = self.store.wake_pending_downlinks(device_id, now_ms()).await;
                self.wake.notify_one();
            }
            Err(error) => {
                tracing::warn!(%error, device = device_id, "could not read a downlink route");
                return;
            }
        }
        self.routes.lock().insert(device_id.to_string(), route);
    }

    /// How `device_id` is reached now: its own `endpoint` (an IoT Agent
    /// device) first, else the route its uplinks came through.
    pub async fn route(&self, device_id: &str) -> Result<Option<DownlinkRoute>, StoreError> {
        if let Some(endpoint) = self
            .catalog
            .device(device_id)
            .and_then(|d| d.endpoint.clone())
        {
            return Ok(Some(DownlinkRoute::IotAgentHttp { endpoint }));
        }
        if let Some(route) = self.routes.lock().get(device_id) {
            return Ok(Some(route.clone()));
        }
        self.store.downlink_route(device_id).await
    }

    /// The ChirpStack API configured for `device_id`'s type, or the global one.
    fn chirpstack_for(&self, device_id: &str) -> Option<&ChirpStackApi> {
        let device_type = self
            .catalog
            .device(device_id)
            .map(|d| d.device_type.clone());
        device_type
            .and_then(|t| self.config.chirpstack_by_type.get(&t))
            .or(self.config.chirpstack.as_ref())
    }

    // --- the NGSI command pattern ------------------------------------------

    /// The commands `entity_id` takes, when it is a device's entity (the
    /// default tenant, service path `/`, the device type's entity type)
    /// whose type declares any.
    pub fn commands_of(
        &self,
        tenant: &str,
        service_path: &str,
        entity_id: &str,
        entity_type: Option<&str>,
    ) -> Vec<String> {
        if tenant != DEFAULT_TENANT || service_path != "/" {
            return Vec::new();
        }
        let Some(device) = self.catalog.device(entity_id) else {
            return Vec::new();
        };
        let Some(device_type) = self.catalog.device_type(&device.device_type) else {
            return Vec::new();
        };
        if entity_type.is_some_and(|t| t != entity_type_of(&device_type)) {
            return Vec::new();
        }
        device_type.def.commands.clone()
    }

    /// Takes the command attributes out of an NGSI update of a device's
    /// entity: what remains is applied as usual, what is taken goes to
    /// [`Downlinks::send_commands`]. Nothing is taken from entities that
    /// are not devices with commands.
    pub fn take_commands(
        &self,
        tenant: &str,
        service_path: &str,
        entity_id: &str,
        entity_type: Option<&str>,
        attrs: &mut AttrMap,
    ) -> Vec<(String, Value)> {
        let commands = self.commands_of(tenant, service_path, entity_id, entity_type);
        let mut taken = Vec::new();
        for command in commands {
            if let Some(attr) = attrs.remove(&command) {
                taken.push((command, attr.value));
            }
        }
        taken
    }

    /// Queues one downlink per command and marks `<command>_status`
    /// `PENDING` on the device's entity, as the IoT Agents do. The payload
    /// is the codec's encoding of `{<command>: value}`; without an encoder,
    /// the value itself (a string's text, anything else its JSON). A device
    /// with an `endpoint` gets the command object as it is, no encoding.
    pub async fn send_commands(
        &self,
        device_id: &str,
        commands: Vec<(String, Value)>,
    ) -> Result<(), DownlinkError> {
        let device = self
            .catalog
            .device(device_id)
            .ok_or_else(|| DownlinkError::UnknownDevice(device_id.to_string()))?;
        let device_type = self.catalog.device_type(&device.device_type);
        for (command, value) in commands {
            let mut data = Map::new();
            data.insert(command.clone(), value.clone());
            let request = DownlinkRequest {
                f_port: None,
                confirmed: false,
                priority: "NORMAL".to_string(),
                payload: DownlinkPayload::Data(Value::Object(data)),
                expires_at: None,
            };
            let (bytes, f_port) = if device.endpoint.is_some() {
                (Vec::new(), 1)
            } else {
                match self
                    .encode(
                        device_type.as_deref(),
                        &device.variables,
                        std::slice::from_ref(&request),
                    )
                    .await
                {
                    Ok(mut encoded) => {
                        let encoded = encoded.remove(0);
                        (encoded.bytes, encoded.f_port)
                    }
                    Err(DownlinkError::Encode {
                        no_encoder: true, ..
                    }) => {
                        let bytes = match &value {
                            Value::String(text) => text.clone().into_bytes(),
                            other => other.to_string().into_bytes(),
                        };
                        check_length(&bytes).map_err(|description| DownlinkError::Encode {
                            description,
                            errors: Vec::new(),
                            warnings: Vec::new(),
                            no_encoder: true,
                        })?;
                        (bytes, 1)
                    }
                    Err(other) => return Err(other),
                }
            };
            let downlink = new_downlink(
                device_id,
                request,
                bytes,
                f_port,
                Some(command.clone()),
                now_ms(),
            );
            // PENDING before the worker can see it, so a fast delivery's
            // DELIVERED is never overwritten.
            self.set_command_attrs(device_id, &command, "PENDING", None)
                .await;
            if let Err(error) = self.store_queued(device_id, vec![downlink], false).await {
                self.set_command_attrs(
                    device_id,
                    &command,
                    "ERROR",
                    Some(json!(error.to_string())),
                )
                .await;
                return Err(error);
            }
        }
        Ok(())
    }

    /// A device's answer to its commands (the IoT Agent JSON protocol's
    /// `{"<command>": <result>}`): each command named gets `<command>_status`
    /// `OK` and `<command>_info` the result. Answers the commands that
    /// were recognised.
    pub async fn command_answer(
        &self,
        device_id: &str,
        answers: &Map<String, Value>,
    ) -> Result<Vec<String>, DownlinkError> {
        if self.catalog.device(device_id).is_none() {
            return Err(DownlinkError::UnknownDevice(device_id.to_string()));
        }
        let commands = self.commands_of(DEFAULT_TENANT, "/", device_id, None);
        let mut answered = Vec::new();
        for (name, result) in answers {
            if commands.contains(name) {
                self.set_command_attrs(device_id, name, "OK", Some(result.clone()))
                    .await;
                answered.push(name.clone());
            }
        }
        Ok(answered)
    }

    /// Keeps a command's `<command>_status` / `<command>_info` in step
    /// with its downlink; nothing for downlinks that are no command.
    async fn follow_command(&self, downlink: &Downlink, status: &str, info: Option<Value>) {
        if let Some(command) = &downlink.command {
            self.set_command_attrs(&downlink.device_id, command, status, info)
                .await;
        }
    }

    /// Sets `<command>_status` (and `<command>_info` when given) on the
    /// device's entity, creating the attributes, or the entity itself for
    /// a device that never sent an uplink.
    async fn set_command_attrs(
        &self,
        device_id: &str,
        command: &str,
        status: &str,
        info: Option<Value>,
    ) {
        let Some(device) = self.catalog.device(device_id) else {
            return;
        };
        let entity_type = self
            .catalog
            .device_type(&device.device_type)
            .map(|t| entity_type_of(&t))
            .unwrap_or_else(|| device.device_type.clone());
        let mut attrs = AttrMap::new();
        attrs.insert(
            format!("{command}_status"),
            Attribute::new(json!(status), "commandStatus"),
        );
        if let Some(info) = info {
            attrs.insert(
                format!("{command}_info"),
                Attribute::new(info, "commandResult"),
            );
        }
        let now = now_ms();
        let mut entity = ngsi::Entity::new(device_id.to_string(), &entity_type);
        entity.attrs = attrs;
        // No entity yet: it is created with the status, as the IoT Agents
        // provision the entity before any measure.
        let result = self
            .context
            .upsert(
                DEFAULT_TENANT,
                "/",
                Some(&entity_type),
                entity,
                |new| {
                    new.stamp_created(now);
                    Ok(())
                },
                |e, attrs| Ok(ngsi::append(e, attrs, Default::default(), now)),
            )
            .await;
        if let Err(error) = result {
            tracing::warn!(device = device_id, command, error = %error.description, "command status not set");
        }
    }
}

/// A new queued downlink of `request`, with its encoded payload.
fn new_downlink(
    device_id: &str,
    request: DownlinkRequest,
    frm_payload: Vec<u8>,
    f_port: u32,
    command: Option<String>,
    now: i64,
) -> Downlink {
    Downlink {
        id: uuid::Uuid::new_v4().to_string(),
        device_id: device_id.to_string(),
        f_port,
        confirmed: request.confirmed,
        priority: request.priority,
        frm_payload,
        data: match request.payload {
            DownlinkPayload::Data(data) => Some(data),
            DownlinkPayload::Raw(_) => None,
        },
        command,
        status: DownlinkStatus::Queued,
        reason: None,
        attempts: 0,
        route: None,
        created_at: now,
        updated_at: now,
        sent_at: None,
        expires_at: request.expires_at,
        next_attempt_at: now,
    }
}

/// The NGSI entity type a device type's devices get.
pub fn entity_type_of(device_type: &TypeEntry) -> String {
    device_type
        .def
        .entity_type
        .clone()
        .unwrap_or_else(|| device_type.name.clone())
}
