//! A writer's connection: a `tokio_postgres::Client` whose statements are
//! prepared once and kept.
//!
//! Given SQL text, `tokio_postgres` prepares an unnamed statement before
//! every execution: two round trips per statement. A writer runs a fixed,
//! small set of statements over and over on its one connection, and waits
//! for each answer in turn, so the second round trip was a third of its
//! time. `Conn` has the same query methods, taking the same SQL text, and
//! prepares each text once; its `Deref` gives the rest of the client.

use std::collections::HashMap;
use std::ops::Deref;

use parking_lot::Mutex;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Error, Row, Statement};

/// Most statements kept per connection: the writers' SQL is fixed, and
/// text built per call (partition names) is not worth keeping beyond it.
const MAX_STATEMENTS: usize = 256;

/// A client with its prepared statements.
pub(super) struct Conn {
    client: Client,
    statements: Mutex<HashMap<String, Statement>>,
}

impl Conn {
    /// Wraps a new connection.
    pub(super) fn new(client: Client) -> Conn {
        Conn {
            client,
            statements: Mutex::new(HashMap::new()),
        }
    }

    async fn statement(&self, sql: &str) -> Result<Statement, Error> {
        if let Some(statement) = self.statements.lock().get(sql) {
            return Ok(statement.clone());
        }
        let statement = self.client.prepare(sql).await?;
        let mut statements = self.statements.lock();
        if statements.len() < MAX_STATEMENTS {
            statements.insert(sql.to_string(), statement.clone());
        }
        Ok(statement)
    }

    /// As `Client::execute`, prepared once.
    pub(super) async fn execute(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, Error> {
        let statement = self.statement(sql).await?;
        self.client.execute(&statement, params).await
    }

    /// As `Client::query`, prepared once.
    pub(super) async fn query(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, Error> {
        let statement = self.statement(sql).await?;
        self.client.query(&statement, params).await
    }

    /// As `Client::query_one`, prepared once.
    pub(super) async fn query_one(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Row, Error> {
        let statement = self.statement(sql).await?;
        self.client.query_one(&statement, params).await
    }

    /// As `Client::query_opt`, prepared once.
    pub(super) async fn query_opt(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<Row>, Error> {
        let statement = self.statement(sql).await?;
        self.client.query_opt(&statement, params).await
    }
}

impl Deref for Conn {
    type Target = Client;

    fn deref(&self) -> &Client {
        &self.client
    }
}
