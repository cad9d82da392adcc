//! NGSI registrations (`/v2/registrations`): context providers announced
//! to the broker, kept per tenant and persisted through the store.

use std::sync::Arc;

use weft_store::{Store, StoreError};

/// Every tenant's registrations.
pub struct Registrations {
    #[allow(dead_code)]
    store: Arc<dyn Store>,
}

impl Registrations {
    /// Loads the stored registrations.
    pub async fn load(store: Arc<dyn Store>) -> Result<Registrations, StoreError> {
        Ok(Registrations { store })
    }
}
