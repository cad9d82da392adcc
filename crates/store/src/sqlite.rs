pub struct SqliteStore; pub struct SqliteConfig;
